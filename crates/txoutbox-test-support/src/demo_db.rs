//! A database for a demo or an example program: the one `DATABASE_URL` names, or a throwaway
//! cluster of its own (`charge-service --demo`, `cargo run -p txoutbox --example handler`).

use anyhow::Result;
use txoutbox::pg::PgConfig;

use crate::{Cluster, ClusterOptions};

/// Where a demo runs: `DATABASE_URL` when it is set and not blank, otherwise a private throwaway
/// cluster under `target/`, stopped and removed when this is dropped.
#[derive(Debug)]
pub struct DemoDatabase {
    url: String,
    cluster: Option<Cluster>,
}

impl DemoDatabase {
    /// `DATABASE_URL`, or a throwaway cluster started from the Postgres binaries on this
    /// machine (a few seconds).
    pub fn from_env() -> Result<Self> {
        if let Some(url) = std::env::var("DATABASE_URL")
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            return Ok(Self { url, cluster: None });
        }
        let cluster = Cluster::private(&ClusterOptions::default())?;
        Ok(Self {
            url: cluster.admin().url(),
            cluster: Some(cluster),
        })
    }

    /// The connection string (a URL or libpq's key=value form).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its connection configuration (TLS included, what `Relay::builder` takes) and a
    /// connection, driven by a task of its own.
    pub async fn connect(&self) -> Result<(PgConfig, tokio_postgres::Client)> {
        let pg = PgConfig::parse(&self.url)?;
        let (client, connection) = pg.connect().await?;
        tokio::spawn(txoutbox::pg::drive(connection));
        Ok((pg, client))
    }

    /// The throwaway cluster's `postgres://` URL, to print (none when `DATABASE_URL` was given).
    pub fn throwaway_url(&self) -> Option<String> {
        let admin = self.cluster.as_ref()?.admin();
        Some(format!(
            "postgres://{}@{}:{}/{}",
            admin.user(),
            admin.host(),
            admin.port(),
            admin.dbname()
        ))
    }

    /// The URL of a second database `name` on the throwaway cluster, created if it is not
    /// there (a second service of the demo gets a database of its own); `None` when
    /// `DATABASE_URL` was given (the caller decides where that service goes).
    pub async fn create_database(&self, name: &str) -> Result<Option<String>> {
        let Some(cluster) = &self.cluster else {
            return Ok(None);
        };
        let admin = cluster.admin();
        let client = admin.connect().await?;
        let exists = client
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
            .await?
            .is_some();
        if !exists {
            let quoted = format!("\"{}\"", name.replace('"', "\"\""));
            client
                .batch_execute(&format!("CREATE DATABASE {quoted}"))
                .await?;
        }
        Ok(Some(admin.with_dbname(name).url()))
    }
}
