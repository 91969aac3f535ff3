//! The email sink's file transport with a real Postgres and the real relay: one `.eml` per row,
//! carrying the row's Message-ID, and the file as the receipt.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::{delivered_receipt, enqueue, receipt};
use txoutbox::{relay::RelayConfig, sink::Sink};
use txoutbox_email::{EmailSink, DESTINATION};
use txoutbox_test_support::relay::RunningRelay;
use txoutbox_test_support::smtp::parse_eml;
use txoutbox_test_support::test_db_with_client;

#[tokio::test]
async fn each_row_becomes_one_eml_file_with_its_message_id() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mail_dir = dir.path().join("outgoing"); // created by the sink
    let (db, mut client) = test_db_with_client().await?;
    let keys = ["file-1", "file-2", "file-3"];
    for key in keys {
        enqueue(&mut client, &receipt().header("X-Key", key), key).await?;
    }
    let relay = RunningRelay::start(
        db.relay()?
            .sink(DESTINATION, EmailSink::file_dir(&mail_dir)?)
            .build()?,
    );
    let mut receipts = BTreeMap::new();
    for key in keys {
        receipts.insert(
            key,
            delivered_receipt(&client, key).await?.unwrap_or_default(),
        );
    }
    relay.stop().await?;

    let files: Vec<PathBuf> = std::fs::read_dir(&mail_dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    assert_eq!(files.len(), 3, "one file per message: {files:?}");
    assert!(files
        .iter()
        .all(|f| f.extension().is_some_and(|x| x == "eml")));
    for key in keys {
        let file = PathBuf::from(&receipts[key]);
        assert!(
            files.contains(&file),
            "the receipt names the file: {file:?}"
        );
        let mail = parse_eml(&file)?;
        assert_eq!(
            mail.message_id(),
            Some(format!("<{key}@example.com>").as_str())
        );
        assert_eq!(mail.header("Idempotency-Key"), Some(key));
        assert_eq!(mail.header("X-Key"), Some(key));
        assert_eq!(mail.header("Subject"), Some("Your receipt"));
        assert_eq!(mail.text.as_deref().map(str::trim), Some("Thanks, Ada."));
    }
    Ok(())
}

#[test]
fn the_file_transport_has_no_timeout_of_its_own_and_suits_any_lease() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sink = EmailSink::file_dir(dir.path())?;
    assert_eq!(sink.timeout(), None);
    let pg: tokio_postgres::Config = "host=127.0.0.1 user=postgres".parse()?;
    let shortest = RelayConfig::default().with_lease(std::time::Duration::from_millis(100));
    assert!(txoutbox::relay::Relay::builder(pg)
        .config(shortest)
        .sink(DESTINATION, sink)
        .build()
        .is_ok());
    Ok(())
}
