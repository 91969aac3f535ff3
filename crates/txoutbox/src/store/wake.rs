//! The relays' wake-up channel (no table): the write path's hint and the relay's LISTEN.

use std::future::Future;

use super::{Result, TxExecutor};

/// A hint on the relays' wake-up channel.
pub(super) const NOTIFY: &str = concat!("SELECT pg_notify('", wake_channel!(), "', '')");

/// The channel the write path's hint arrives on.
const LISTEN: &str = concat!("LISTEN ", wake_channel!());
/// Starts listening on the channel, on the relay's dedicated connection.
pub(crate) fn listen(client: &tokio_postgres::Client) -> impl Future<Output = Result<()>> + '_ {
    client.batch_execute(LISTEN)
}

/// Sends the hint (delivered at the commit of the transaction it runs in, if any).
pub(crate) async fn notify(conn: &impl TxExecutor) -> Result<()> {
    conn.rows(NOTIFY, &[]).await?;
    Ok(())
}
