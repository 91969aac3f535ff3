//! A relay that dies mid-attempt: the downstream got the row, the outcome was never written.

use std::time::Duration;

use anyhow::Result;
use txoutbox::relay::{RelayBuilder, RelayConfig};

use crate::relay::{CrashableRelay, HangAfter, RecordingSink};
use crate::TestDb;

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
