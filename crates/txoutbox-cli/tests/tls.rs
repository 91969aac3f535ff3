//! The `txoutbox` binary over TLS, as libpq's settings in `DATABASE_URL` and the `PG*` variables
//! say: against a Postgres with `ssl=on` and a CA the test makes, and the shared cluster (no TLS).

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use tokio_postgres::Client;
use txoutbox::{enqueue, OutboxMessage};
use txoutbox_test_support::process::OwnedChild;
use txoutbox_test_support::process::{one_error_line, stdout_lines, succeeded};
use txoutbox_test_support::tls::{TestCa, TlsServer};
use txoutbox_test_support::{eventually_some, Cluster, TestDb};

#[path = "support/dashboard.rs"]
mod dashboard;

use dashboard::{get, serve, txoutbox};

type TestResult = anyhow::Result<()>;

/// `postgres://postgres@localhost:PORT/DB?sslmode=verify-full&sslrootcert=CA` (the path escaped).
fn verify_full_url(server: &TlsServer, db: &TestDb, ca: &std::path::Path) -> String {
    format!(
        "postgres://postgres@localhost:{}/{}?sslmode=verify-full&sslrootcert={}",
        server.cluster.port(),
        db.info().dbname(),
        ca.display().to_string().replace('/', "%2F")
    )
}

/// Sessions of `application_name` on the server, and how many of them are encrypted.
async fn sessions(client: &Client, application_name: &str) -> anyhow::Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl) \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = $1",
            &[&application_name],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Waits until `application_name` has a session; the sessions and the encrypted ones then.
async fn wait_for_sessions(client: &Client, application_name: &str) -> anyhow::Result<(i64, i64)> {
    eventually_some(&format!("a session of {application_name}"), || async {
        let seen = sessions(client, application_name).await?;
        Ok((seen.0 > 0).then_some(seen))
    })
    .await
}

#[tokio::test]
async fn stats_over_verify_full_with_the_right_ca_succeeds() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let db = TestDb::create_on(&server.verified()).await?;
    let out = txoutbox()
        .args(["stats", "--json"])
        .env(
            "DATABASE_URL",
            verify_full_url(&server, &db, server.ca_file()),
        )
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert!(stats.is_object(), "{stats}");
    Ok(())
}

#[tokio::test]
async fn stats_with_another_ca_fails_in_one_line_naming_the_ca_file() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let db = TestDb::create_on(&server.verified()).await?;
    let stranger = TestCa::new("another CA")?;
    let other_ca = server.write_file("other-ca.pem", &stranger.cert_pem())?;
    let out = txoutbox()
        .arg("stats")
        .env("DATABASE_URL", verify_full_url(&server, &db, &other_ca))
        .output()?;
    let err = one_error_line(&out);
    assert!(err.contains("cannot connect to the database"), "{err}");
    assert!(
        err.contains(&format!(
            "TLS: the server's certificate is not signed by the CA in {} (sslrootcert)",
            other_ca.display()
        )),
        "{err}"
    );
    Ok(())
}

/// `txoutbox stats` on `url` with `PGSSLMODE` and `PGSSLROOTCERT` set.
fn stats_with_pg_tls(url: &str, sslmode: &str, rootcert: &Path) -> anyhow::Result<Output> {
    Ok(txoutbox()
        .arg("stats")
        .env("DATABASE_URL", url)
        .env("PGSSLMODE", sslmode)
        .env("PGSSLROOTCERT", rootcert)
        .output()?)
}

#[tokio::test]
async fn pgsslmode_and_pgsslrootcert_apply_to_a_database_url_without_tls_settings() -> TestResult {
    let server = TlsServer::start(&["db.example"])?;
    let db = TestDb::create_on(&server.verified().with_tls("sslmode", "verify-ca")).await?;
    let url = format!(
        "host=localhost port={} user=postgres dbname={}",
        server.cluster.port(),
        db.info().dbname()
    );
    let chain_only = stats_with_pg_tls(&url, "verify-ca", server.ca_file())?;
    succeeded(&chain_only);
    // The certificate is for db.example: verify-full from the environment refuses localhost.
    let full = stats_with_pg_tls(&url, "verify-full", server.ca_file())?;
    let err = one_error_line(&full);
    assert!(
        err.contains(
            "TLS: the server's certificate is not issued for \"localhost\" but for db.example"
        ),
        "{err}"
    );
    Ok(())
}

#[test]
fn require_against_a_server_without_tls_is_one_clear_line() -> TestResult {
    let cluster = Cluster::shared()?;
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        cluster.port()
    );
    std::mem::forget(cluster);
    let out = txoutbox()
        .arg("migrate")
        .env("DATABASE_URL", url)
        .output()?;
    let err = one_error_line(&out);
    assert!(
        err.contains("TLS: the server does not accept TLS connections"),
        "{err}"
    );
    Ok(())
}

#[test]
fn verify_full_without_a_ca_is_one_line_naming_sslrootcert() -> TestResult {
    let out = txoutbox()
        .arg("stats")
        .env("HOME", "/nonexistent")
        .env(
            "DATABASE_URL",
            "postgres://postgres@localhost:1/postgres?sslmode=verify-full",
        )
        .output()?;
    let err = one_error_line(&out);
    assert!(err.contains("DATABASE_URL"), "{err}");
    assert!(err.contains("sslrootcert: sslmode=verify-full"), "{err}");
    Ok(())
}

#[tokio::test]
async fn the_relay_process_delivers_over_verify_full_with_every_session_encrypted() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let db = TestDb::create_on(&server.verified()).await?;
    let mut client = db.connect().await?;
    let url = format!(
        "{}&application_name=tls-relay",
        verify_full_url(&server, &db, server.ca_file())
    );
    let mut child = txoutbox()
        .args(["relay", "--stdout", "audit", "--poll-interval", "100ms"])
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()?;
    let lines = stdout_lines(&mut child)?;
    let _relay = OwnedChild::from(child);
    let tx = client.transaction().await?;
    let message = OutboxMessage::new("audit", &serde_json::json!({ "n": 1 }))?
        .with_downstream_key("audit-tls");
    enqueue(&tx, &[message]).await?;
    tx.commit().await?;
    let line = lines.recv_timeout(Duration::from_secs(20))?;
    let value: serde_json::Value = serde_json::from_str(&line)?;
    assert_eq!(value["downstream_key"], "audit-tls");
    let (total, encrypted) = wait_for_sessions(&client, "tls-relay").await?;
    assert!(
        total >= 2,
        "{total} sessions of the relay (its pool and its LISTEN)"
    );
    assert_eq!(encrypted, total);
    Ok(())
}

#[tokio::test]
async fn the_dashboard_reads_over_verify_full_with_its_pool_encrypted() -> TestResult {
    let server = TlsServer::start(&["localhost"])?;
    let db = TestDb::create_on(&server.verified()).await?;
    let client = db.connect().await?;
    let url = format!(
        "{}&application_name=tls-dashboard",
        verify_full_url(&server, &db, server.ca_file())
    );
    let dashboard = serve(&url, &["--addr", "127.0.0.1:0"])?;
    let answer = get(&dashboard.addr, "/api/stats", None)?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (total, encrypted) = wait_for_sessions(&client, "tls-dashboard").await?;
    assert!(total >= 1, "no session of the dashboard");
    assert_eq!(encrypted, total);
    Ok(())
}
