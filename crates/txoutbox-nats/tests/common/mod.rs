//! What the JetStream tests share: deleting a test's stream when its fixture is dropped.

use async_nats::jetstream;

/// Deletes the stream `name` on the server at `url`, from a `Drop` (which cannot await): on a
/// runtime and a thread of its own, waited for; a server that is gone is left alone.
pub fn delete_stream_now(url: String, name: String) {
    let _ = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            if let Ok(client) = async_nats::connect(url.as_str()).await {
                let _ = jetstream::new(client).delete_stream(&name).await;
            }
        });
    })
    .join();
}
