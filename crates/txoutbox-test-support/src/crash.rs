//! A relay that dies mid-attempt: the downstream got the row, the outcome was never written.

use std::time::Duration;

use anyhow::Result;
use txoutbox::relay::{RelayBuilder, RelayConfig};
use txoutbox::sink::Sink;

use crate::relay::{short_lease, CrashableRelay, HangAfter, RecordingSink, RunningRelay};
use crate::{TestDb, WAIT_LIMIT};

/// The lease of the relay [`kill_after_a_call`] kills: what the next relay waits out.
pub const KILLED_LEASE: Duration = Duration::from_millis(500);

/// Runs a relay on a runtime of its own, with a lease of [`KILLED_LEASE`] and `destination`'s
/// calls going to a sink that delivers and never answers; `configure` adds the policies. Waits
/// (10 s at most) for the first call and kills the relay there, as a process dies after the
/// downstream got the row and before its outcome was written. Returns the sink, which recorded
/// the call.
pub async fn kill_after_a_call(
    db: &TestDb,
    destination: &str,
    configure: impl FnOnce(RelayBuilder) -> RelayBuilder + Send + 'static,
) -> Result<RecordingSink> {
    let recorder = RecordingSink::new();
    let sink = HangAfter::new(recorder.clone());
    let called = sink.delivered.clone();
    let builder = db.relay()?;
    let destination = destination.to_owned();
    let relay = CrashableRelay::start(move || {
        let builder = builder
            .config(RelayConfig::default().with_lease(KILLED_LEASE))
            .sink(destination, sink);
        Ok(configure(builder).build()?)
    })?;
    tokio::time::timeout(Duration::from_secs(10), called.notified()).await?;
    relay.kill();
    Ok(recorder)
}

/// Drains `db` with a relay of [`restart_config`](crate::relay::restart_config) whose sink takes
/// 2 ms a call for each of `destinations`, restarting `cluster` (an immediate stop, as a crash)
/// after 300 calls, until `total` rows are delivered: see
/// [`drain_through_a_restart`](crate::relay::drain_through_a_restart).
pub async fn drain_across_a_restart(
    cluster: &crate::Cluster,
    db: &TestDb,
    destinations: &[&str],
    total: i64,
) -> Result<crate::relay::Drained> {
    use crate::relay::{drain_through_a_restart, restart_config, RunningRelay, SlowSink};
    let sink = SlowSink(RecordingSink::new(), Duration::from_millis(2));
    let mut builder = db.relay()?.config(restart_config());
    for destination in destinations {
        builder = builder.sink(*destination, sink.clone());
    }
    let relay = RunningRelay::start(builder.build()?);
    drain_through_a_restart(cluster, db, relay, &sink.0, 300, total).await
}

/// Starts a relay of [`short_lease`] (and what `configure` adds) whose `destination` calls go to
/// `sink`, waits ([`WAIT_LIMIT`] at most) until `sink` has delivered a first call, and aborts
/// the relay there, as a process killed after the downstream took the row: the outcome is never
/// written and the lease stays until it expires.
pub async fn abort_after_a_call(
    db: &TestDb,
    destination: &str,
    sink: impl Sink,
    configure: impl FnOnce(RelayBuilder) -> RelayBuilder,
) -> Result<()> {
    let sink = HangAfter::new(sink);
    let delivered = sink.delivered.clone();
    let builder = db
        .relay()?
        .config(short_lease())
        .sink(destination.to_owned(), sink);
    let relay = RunningRelay::start(configure(builder).build()?);
    tokio::time::timeout(WAIT_LIMIT, delivered.notified()).await?;
    drop(relay);
    Ok(())
}
