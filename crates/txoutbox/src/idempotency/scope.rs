//! A key scope (tenant, account, route): its name, window, lock timeout and shortest key, and the
//! limits every scope and inbox window is checked against.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
use crate::outbox::check_name;

/// The most effects one request stores on its key row in a scope with deferred effects: a
/// request with more writes them all as rows at once, so that a fan-out, which moves the effects
/// of up to 100 keys in one statement, stays a statement of bounded size.
pub const MAX_DEFERRED_EFFECTS: usize = 100;

/// The default key window: a retry within 24 hours of the first request is deduplicated.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request waits for a concurrent request holding the same key before answering 409.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// The shortest window accepted: a shorter one would expire a key before its request commits.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// The longest window accepted (100 years): `now() + window` must stay a valid Postgres
/// timestamp, and no retry comes later than that.
pub const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The longest lock timeout accepted: a request waits this long for a concurrent holder of its
/// key while holding an HTTP connection and a database connection.
pub const MAX_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// The shortest key [`begin`](super::begin) accepts by default, in characters. A client's key is the only thing
/// that tells its retries from other clients' requests; a short one can be guessed or collide
/// (draft-ietf-httpapi-idempotency-key-header, Security Considerations). A UUID has 36.
pub const DEFAULT_MIN_KEY_LEN: usize = 16;

/// A key namespace (tenant, account, route) with its own window.
///
/// A key is looked up within its scope only: the same key in two scopes is two requests.
///
/// ```
/// use std::time::Duration;
/// use txoutbox::Scope;
///
/// // Batch clients retry the next day: remember their keys for a week.
/// let scope = Scope::new("invoices")?.with_window(Duration::from_secs(7 * 24 * 3600))?;
/// assert_eq!(scope.name(), "invoices");
/// assert_eq!(scope.window(), Duration::from_secs(7 * 24 * 3600));
/// assert!(Scope::new("").is_err(), "a scope has a name");
/// assert!(Scope::new("x")?.with_window(Duration::ZERO).is_err(), "zero would forget every key");
/// # Ok::<(), txoutbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub(super) name: String,
    pub(super) window: Duration,
    pub(super) lock_timeout: Duration,
    pub(super) min_key_len: usize,
    pub(super) metric_label: Option<&'static str>,
    pub(super) deferred_effects: bool,
}

impl Scope {
    /// A scope with the default window (24 h), lock timeout (2 s) and shortest key (16
    /// characters).
    ///
    /// Fails for an empty name, one over 255 bytes, or one with control characters.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_name("scope", &name)?;
        Ok(Self {
            name,
            window: DEFAULT_WINDOW,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            min_key_len: DEFAULT_MIN_KEY_LEN,
            metric_label: None,
            deferred_effects: false,
        })
    }

    /// How long a key is remembered. A batch client that retries tomorrow needs a week.
    ///
    /// Fails with [`Error::Config`] for a window shorter than [`MIN_WINDOW`] (zero would forget
    /// every key at once) or longer than [`MAX_WINDOW`] (100 years).
    pub fn with_window(mut self, window: Duration) -> Result<Self> {
        check_window(&format!("scope {:?}", self.name), window)?;
        self.window = window;
        Ok(self)
    }

    /// How long to wait for a concurrent holder of the same key (then [`Begin::InFlight`](super::Begin::InFlight)).
    ///
    /// Fails with [`Error::Config`] for zero (Postgres reads a `lock_timeout` of 0 as "wait
    /// forever") or more than [`MAX_LOCK_TIMEOUT`] (60 s).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Result<Self> {
        check_lock_timeout(&format!("scope {:?}", self.name), timeout)?;
        self.lock_timeout = timeout;
        Ok(self)
    }

    /// The shortest key [`begin`](super::begin) accepts in this scope ([`DEFAULT_MIN_KEY_LEN`] by default); a
    /// shorter one is refused with [`KeyError::TooShort`] (400). Lower it for clients that send
    /// short keys of their own design (order numbers); 1 accepts any key.
    ///
    /// Fails with [`Error::Config`] outside `1..=`[`MAX_KEY_LEN`].
    pub fn with_min_key_len(mut self, min: usize) -> Result<Self> {
        if !(1..=MAX_KEY_LEN).contains(&min) {
            return Err(Error::Config(format!(
                "scope {:?}: shortest key length {min} is outside 1..={MAX_KEY_LEN}",
                self.name
            )));
        }
        self.min_key_len = min;
        Ok(self)
    }

    /// The `scope` label of this scope's idempotency metrics (replays, mismatches, conflicts),
    /// instead of its name. For names that carry a tenant or account id (`tenant:42:charges`):
    /// one label value per tenant would grow the metrics without bound. A `&'static str`, so the
    /// label values stay a fixed set.
    pub fn with_metric_label(mut self, label: &'static str) -> Self {
        self.metric_label = Some(label);
        self
    }

    /// Stores each request's effects on its key row, one row per request however many effects,
    /// and lets the relay write them into `txoutbox_messages` in batches, off the request path.
    /// The request then writes one row (its key, response and effects) besides its business rows:
    /// the cheapest write path (README, Performance). What changes: the effects appear in
    /// `txoutbox_messages` (and `txoutbox list`) when a relay fans them out, a few milliseconds
    /// after the commit with a relay running (`txoutbox stats` counts those not yet fanned out),
    /// and a key is not pruned while it still carries effects. Effects with an ordering key or a
    /// downstream key of their own are written as rows at once, as without this option: their
    /// commit order and their deduplication are decided when they are enqueued; so are all the
    /// effects of a request with more than [`MAX_DEFERRED_EFFECTS`].
    pub fn with_deferred_effects(mut self) -> Self {
        self.deferred_effects = true;
        self
    }

    /// Whether the scope's requests store their effects on their key rows
    /// ([`Scope::with_deferred_effects`]).
    pub fn deferred_effects(&self) -> bool {
        self.deferred_effects
    }

    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The scope's key window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// How long a request waits for a concurrent holder of its key.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The shortest key accepted in this scope, in characters.
    pub fn min_key_len(&self) -> usize {
        self.min_key_len
    }

    /// Refuses a key shorter than the scope's [`Scope::min_key_len`].
    pub fn check_key(&self, key: &IdempotencyKey) -> Result<(), KeyError> {
        let len = key.as_str().len();
        if len < self.min_key_len {
            return Err(KeyError::TooShort {
                len,
                min: self.min_key_len,
            });
        }
        Ok(())
    }
}

impl Scope {
    /// The `scope` label of this scope's metrics.
    pub(crate) fn metric_label_value(&self) -> metrics::SharedString {
        match self.metric_label {
            Some(label) => metrics::SharedString::const_str(label),
            None => self.name.clone().into(),
        }
    }
}

/// Refuses a key or record window outside [`MIN_WINDOW`]..=[`MAX_WINDOW`]; `owner` names what
/// it is for (`scope "charges"`).
pub(crate) fn check_window(owner: &str, window: Duration) -> Result<()> {
    if window < MIN_WINDOW || window > MAX_WINDOW {
        return Err(Error::Config(format!(
            "{owner}: window {window:?} is outside {MIN_WINDOW:?}..={} days",
            MAX_WINDOW.as_secs() / 86_400
        )));
    }
    Ok(())
}

/// Refuses a lock timeout outside 1 ms..=[`MAX_LOCK_TIMEOUT`] (Postgres reads 0 as "wait
/// forever"); `owner` names what it is for.
pub(crate) fn check_lock_timeout(owner: &str, timeout: Duration) -> Result<()> {
    if timeout < Duration::from_millis(1) || timeout > MAX_LOCK_TIMEOUT {
        return Err(Error::Config(format!(
            "{owner}: lock timeout {timeout:?} is outside 1ms..={MAX_LOCK_TIMEOUT:?}"
        )));
    }
    Ok(())
}
