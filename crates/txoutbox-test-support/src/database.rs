//! One fresh database per test, cloned from a template migrated once per schema version.

use std::sync::OnceLock;

use anyhow::{Context, Result};
use tokio_postgres::config::Host;
use tokio_postgres::Client;
use txoutbox::pg::PgConfig;

use crate::Cluster;

/// Where a database is: enough to connect, and to hand to a child process as `DATABASE_URL`.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    host: String,
    port: u16,
    user: String,
    password: Option<String>,
    dbname: String,
    /// TLS parameters (`sslmode`, `sslrootcert`...), in the order given.
    tls: Vec<(String, String)>,
}

impl ConnInfo {
    /// A TCP (or, for a host starting with `/`, Unix socket) connection.
    pub fn tcp(host: &str, port: u16, user: &str, password: Option<&str>, dbname: &str) -> Self {
        Self {
            host: host.to_owned(),
            port,
            user: user.to_owned(),
            password: password.map(str::to_owned),
            dbname: dbname.to_owned(),
            tls: Vec::new(),
        }
    }

    /// Parses a `postgres://` URL or a key=value string (its TLS settings kept).
    pub fn parse(url: &str) -> Result<Self> {
        let pg = PgConfig::parse(url).context("parsing DATABASE_URL")?;
        let mut tls = vec![("sslmode".to_owned(), pg.ssl_mode().to_string())];
        if let Some(root) = pg.root_cert() {
            tls.push(("sslrootcert".to_owned(), root.display().to_string()));
        }
        if let Some((cert, key)) = pg.client_cert() {
            tls.push(("sslcert".to_owned(), cert.display().to_string()));
            tls.push(("sslkey".to_owned(), key.display().to_string()));
        }
        let config = pg.config();
        let host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(Host::Unix(p)) => p.display().to_string(),
            None => "127.0.0.1".to_owned(),
        };
        Ok(Self {
            host,
            port: config.get_ports().first().copied().unwrap_or(5432),
            user: config.get_user().unwrap_or("postgres").to_owned(),
            password: config
                .get_password()
                .map(|p| String::from_utf8_lossy(p).into_owned()),
            dbname: config.get_dbname().unwrap_or("postgres").to_owned(),
            tls,
        })
    }

    /// The same server, reached by another host name (`localhost` for a certificate's name).
    pub fn with_host(&self, host: &str) -> Self {
        Self {
            host: host.to_owned(),
            ..self.clone()
        }
    }

    /// With a TLS parameter (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) set to `value`.
    pub fn with_tls(&self, key: &str, value: &str) -> Self {
        let mut info = self.clone();
        info.tls.retain(|(k, _)| k != key);
        info.tls.push((key.to_owned(), value.to_owned()));
        info
    }

    /// The host name or address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password, if one is set.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The role.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The same server, another database.
    pub fn with_dbname(&self, dbname: &str) -> Self {
        Self {
            dbname: dbname.to_owned(),
            ..self.clone()
        }
    }

    /// A key=value connection string (works for TCP hosts and socket directories alike).
    pub fn url(&self) -> String {
        let mut s = format!(
            "host={} port={} user={} dbname={}",
            self.host, self.port, self.user, self.dbname
        );
        if let Some(p) = &self.password {
            s.push_str(&format!(" password={p}"));
        }
        for (key, value) in &self.tls {
            s.push_str(&format!(
                " {key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
        s
    }

    /// The database name.
    pub fn dbname(&self) -> &str {
        &self.dbname
    }

    /// Connects, driving the connection on a spawned task.
    pub async fn connect(&self) -> Result<Client> {
        let (client, connection) = self
            .config()?
            .connect()
            .await
            .with_context(|| format!("connecting to {}", self.url()))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// The connection configuration, TLS included (what `Relay::builder` takes).
    pub fn config(&self) -> Result<PgConfig> {
        Ok(PgConfig::parse(&self.url())?)
    }

    /// A connection pool over this database.
    pub fn pool(&self, size: usize) -> Result<deadpool_postgres::Pool> {
        Ok(self.config()?.pool_builder(size).build()?)
    }
}

/// Drops everything txoutbox's migrations create, under every version's names (V4 renamed the
/// attempt log and made `txoutbox_attempts` a view), so a test can migrate the database from
/// nothing or up to an older version.
pub async fn drop_schema(client: &Client) -> Result<()> {
    client
        .batch_execute(
            "DROP VIEW IF EXISTS txoutbox_attempts; \
             DROP FUNCTION IF EXISTS txoutbox_attempts_write; \
             DROP FUNCTION IF EXISTS txoutbox_refuse; \
             DROP TABLE IF EXISTS txoutbox_attempt_log, txoutbox_attempts, txoutbox_destinations, txoutbox_relays, \
                 txoutbox_discarded, txoutbox_delivered, txoutbox_messages, \
                 txoutbox_idempotency_keys, txoutbox_inbox, txoutbox_schema_history; \
             DROP SEQUENCE txoutbox_lease_token_seq",
        )
        .await?;
    Ok(())
}

/// Rolls the schema's recorded version back by one (deletes the newest row of the migration
/// history; the tables stay as they are): a database a txoutbox of this build sees as behind.
/// Returns the version the history now says.
pub async fn forget_last_migration(client: &Client) -> Result<i32> {
    client
        .execute(
            "DELETE FROM txoutbox_schema_history \
             WHERE version = (SELECT max(version) FROM txoutbox_schema_history)",
            &[],
        )
        .await?;
    let row = client
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM txoutbox_schema_history",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The highest migration this build carries (0 when it carries none): the version a migrated
/// schema is at, and the one a refusal names.
pub fn latest_migration() -> i32 {
    txoutbox::admin::embedded_migrations()
        .last()
        .map_or(0, |(version, _, _)| *version)
}

/// Records a migration newer than any this build carries, as a newer txoutbox would have (its
/// time in RFC 3339, as refinery writes it): a database this build must refuse. Returns the
/// version recorded.
pub async fn record_newer_migration(client: &Client) -> Result<i32> {
    let newest = txoutbox::admin::embedded_migrations()
        .last()
        .map(|(version, _, _)| *version)
        .context("this build carries no migration")?;
    let newer = newest + 1;
    client
        .execute(
            "INSERT INTO txoutbox_schema_history (version, name, applied_on, checksum) \
             VALUES ($1, 'from_a_newer_txoutbox', \
                 to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), '0')",
            &[&newer],
        )
        .await?;
    Ok(newer)
}

/// A database of one test's own, dropped (with its connections) when this is dropped.
#[derive(Debug)]
pub struct TestDb {
    info: ConnInfo,
    admin: ConnInfo,
}

impl TestDb {
    /// Where the database is (`url()` gives `DATABASE_URL` for child processes).
    pub fn info(&self) -> &ConnInfo {
        &self.info
    }

    /// The `DATABASE_URL` of this database.
    pub fn url(&self) -> String {
        self.info.url()
    }

    /// A new connection.
    pub async fn connect(&self) -> Result<Client> {
        self.info.connect().await
    }

    /// A relay builder over this database, with test-friendly timings (poll 50 ms, reclaim
    /// 100 ms); sinks and policies are the test's to add.
    pub fn relay(&self) -> Result<txoutbox::relay::RelayBuilder> {
        Ok(txoutbox::relay::Relay::builder(self.info.config()?)
            .config(crate::relay::relay_config()))
    }

    /// The connection configuration of this database.
    pub fn config(&self) -> Result<PgConfig> {
        self.info.config()
    }

    /// A pool of `size` connections.
    pub fn pool(&self, size: usize) -> Result<deadpool_postgres::Pool> {
        self.info.pool(size)
    }

    /// Clones the migrated template into a new database on the server `admin` points to.
    pub async fn create_on(admin: &ConnInfo) -> Result<TestDb> {
        let template = ensure_template(admin).await?;
        let name = format!("txoutbox_t_{}", uuid::Uuid::new_v4().simple());
        let client = admin.connect().await?;
        let mut tries = 0;
        loop {
            match client
                .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
                .await
            {
                Ok(()) => break,
                // Another process may be connected to the template for a moment; try again.
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("creating the test database"),
            }
        }
        Ok(TestDb {
            info: admin.with_dbname(&name),
            admin: admin.clone(),
        })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = self.info.dbname().to_owned();
        // Drop may run inside a runtime: use a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    if let Ok(client) = admin.connect().await {
                        let _ = client
                            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .await;
                    }
                });
            }
        })
        .join();
    }
}

/// A fresh, migrated database for one test: on `DATABASE_URL`'s server when it is set, else on
/// the shared throwaway cluster.
pub async fn test_db() -> Result<TestDb> {
    TestDb::create_on(&admin_info()?).await
}

/// A fresh test database ([`test_db`]) and a connection to it: what most tests open with.
pub async fn test_db_with_client() -> Result<(TestDb, Client)> {
    let db = test_db().await?;
    let client = db.connect().await?;
    Ok((db, client))
}

/// A fresh test database in which `sql` has run (rows written by hand, as an operator or
/// another program would with psql), and a connection to it.
pub async fn test_db_with_sql(sql: &str) -> Result<(TestDb, Client)> {
    let (db, client) = test_db_with_client().await?;
    client.batch_execute(sql).await?;
    Ok((db, client))
}

fn admin_info() -> Result<ConnInfo> {
    static SHARED: OnceLock<ConnInfo> = OnceLock::new();
    if let Some(info) = SHARED.get() {
        return Ok(info.clone());
    }
    let info = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => ConnInfo::parse(&url)?,
        _ => {
            let cluster = Cluster::shared()?;
            let info = cluster.admin();
            // The shared cluster outlives the test process on purpose.
            std::mem::forget(cluster);
            info
        }
    };
    Ok(SHARED.get_or_init(|| info).clone())
}

/// The template for this build's migrations, created and migrated by the first process to ask.
async fn ensure_template(admin: &ConnInfo) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for (version, name, checksum) in txoutbox::admin::embedded_migrations() {
        hash.update(format!("{version}:{name}:{checksum}\n"));
    }
    let template = format!("txoutbox_tmpl_{}", &hex::encode(hash.finalize())[..16]);
    let client = admin.connect().await?;
    // Serialise template creation across the test processes of a run.
    client
        .execute("SELECT pg_advisory_lock(7160716071)", &[])
        .await?;
    let ready: Option<bool> = client
        .query_opt(
            "SELECT datistemplate FROM pg_database WHERE datname = $1",
            &[&template],
        )
        .await?
        .map(|r| r.get(0));
    if ready != Some(true) {
        if ready.is_some() {
            client
                .batch_execute(&format!("DROP DATABASE {template} WITH (FORCE)"))
                .await?;
        }
        client
            .batch_execute(&format!("CREATE DATABASE {template}"))
            .await?;
        let mut db = admin.with_dbname(&template).connect().await?;
        txoutbox::migrate(&mut db).await?;
        drop(db);
        client
            .batch_execute(&format!("ALTER DATABASE {template} WITH IS_TEMPLATE true"))
            .await?;
    }
    client
        .execute("SELECT pg_advisory_unlock(7160716071)", &[])
        .await?;
    Ok(template)
}
