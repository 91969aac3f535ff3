// txoutbox-bench's peer: commit -> task start latency of graphile-worker 0.18 at RATE jobs/s for
// SECS seconds, one transaction a job (add_job, whose trigger NOTIFYs the worker). Prints one
// JSON line: {"timed":n,"sent":N,"p50_ms":..,"p99_ms":..}. The server is given by the PG*
// variables.
const { run, runMigrations, Logger } = require("graphile-worker");
const { Pool } = require("pg");
const quiet = new Logger(() => () => {});
const RATE = parseInt(process.env.RATE || "1000");
const SECS = parseInt(process.env.SECS || "10");
const sent = new Map(); const lat = [];
(async () => {
  const workerPool = new Pool({ max: 28 });
  await runMigrations({ pgPool: workerPool, logger: quiet });
  const pool = new Pool({ max: 8 });
  await pool.query("delete from graphile_worker._private_jobs");
  const runner = await run({ pgPool: workerPool, concurrency: 24, noHandleSignals: true, pollInterval: 1000, logger: quiet,
    taskList: { t: async (p) => { const s = sent.get(p.n); if (s !== undefined) { sent.delete(p.n); lat.push(Number(process.hrtime.bigint() - s) / 1e6); } } } });
  await new Promise(r => setTimeout(r, 500));
  const total = RATE * SECS; let n = 0; const t0 = Date.now();
  const inflight = [];
  while (n < total) {
    const due = Math.floor((Date.now() - t0) * RATE / 1000);
    while (n < due && n < total) {
      const i = n++;
      inflight.push((async () => {
        const c = await pool.connect();
        try {
          await c.query("begin");
          await c.query("select graphile_worker.add_job('t', json_build_object('n', $1::int))", [i]);
          await c.query("commit");
          // Registered as the commit returns; a job run before is not timed (as txoutbox-bench).
          sent.set(i, process.hrtime.bigint());
        } finally { c.release(); }
      })());
    }
    await new Promise(r => setTimeout(r, 1));
  }
  await Promise.all(inflight);
  await new Promise(r => setTimeout(r, 1000));
  await runner.stop(); await pool.end(); await workerPool.end();
  lat.sort((a, b) => a - b);
  const q = p => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))];
  console.log(JSON.stringify({ timed: lat.length, sent: total, p50_ms: q(0.5), p99_ms: q(0.99) }));
  process.exit(0);
})().catch(e => { console.error(e); process.exit(1); });
