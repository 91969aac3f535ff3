//! The relays' wake-up channel (no table): the write path's hint and the relay's LISTEN.

use super::statements::session::{LISTEN, NOTIFY};
use std::future::Future;

use super::{Result, Run, TxExecutor};

/// Starts listening on the channel, on the relay's dedicated connection.
pub(crate) fn listen(client: &tokio_postgres::Client) -> impl Future<Output = Result<()>> + '_ {
    client.batch_execute(LISTEN.sql)
}

/// Sends the hint (delivered at the commit of the transaction it runs in, if any).
pub(crate) async fn notify(conn: &impl TxExecutor) -> Result<()> {
    conn.run(NOTIFY, &[]).await?;
    Ok(())
}

/// Sends the hint on a connection outside any transaction (the waker's own, or one borrowed
/// from the pool), in one message (the simple protocol: no parse, bind and describe).
pub(crate) async fn hint(client: &tokio_postgres::Client) -> Result<()> {
    client.batch_execute(NOTIFY.sql).await
}
