//! Running the API docs' examples against a real database: [`doc_test`].

use std::future::Future;

use tokio_postgres::Client;

/// Runs a doc example against a fresh, migrated test database of its own (the shared throwaway
/// cluster, or `DATABASE_URL`'s server): `body` gets a connection to it, arranges what the
/// example needs, calls it and checks what it did. Panics, failing the doctest, when any step
/// fails. The examples of the API docs call it from hidden lines:
///
/// ```text
/// # txoutbox_test_support::doc_test(|client| async move {
/// #     run(&client).await?;
/// #     Ok(())
/// # });
/// ```
pub fn doc_test<F, Fut>(body: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the doc example");
    let outcome = runtime.block_on(async {
        let db = crate::test_db().await?;
        let client = db.connect().await?;
        let outcome = body(client).await;
        drop(db);
        outcome
    });
    if let Err(error) = outcome {
        panic!("the doc example failed: {error:#}");
    }
}
