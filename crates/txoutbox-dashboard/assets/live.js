// Live refresh: every 5 s, re-reads the page and swaps in its fresh `data-live` sections.
// Paused while the tab is hidden, while the user is typing, has ticked a row or opened a form
// in a live section (the overview's "Pause…"). The pages read the same without it.
(function () {
  "use strict";
  var PERIOD = 5000;
  function busy() {
    var active = document.activeElement;
    if (active && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(active.tagName)) return true;
    if (document.querySelector("[data-live] details[open]") !== null) return true;
    return document.querySelector("input[type=checkbox]:checked") !== null;
  }
  function refresh() {
    if (document.hidden || busy()) return;
    if (document.querySelector("[data-live]") === null) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (text === null) return;
        var fresh = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (old) {
          var next = fresh.getElementById(old.id);
          if (next) old.replaceWith(document.importNode(next, true));
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }
  var timer = null;
  function start() { if (timer === null) timer = window.setInterval(refresh, PERIOD); }
  function stop() { if (timer !== null) { window.clearInterval(timer); timer = null; } }
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stop(); } else { refresh(); start(); }
  });
  if (!document.hidden) start();
})();
