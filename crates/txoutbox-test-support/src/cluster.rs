//! Throwaway Postgres clusters started from the server binaries on this machine.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::tls::ServerCert;
use crate::{free_port, ConnInfo};

/// How a cluster is set up.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Skip flushing to disk (`fsync`, `full_page_writes` off; commits still survive a server
    /// crash, not an OS crash): right for tests,
    /// wrong for benchmarks.
    pub fast: bool,
    /// `max_connections` of the server.
    pub max_connections: u32,
    /// Serve TLS (`ssl=on`) with this certificate (see [`TestCa`](crate::tls::TestCa)); plain
    /// connections are still accepted.
    pub tls: Option<ServerCert>,
    /// With `tls`: the PEM certificate of a CA whose client certificates TCP connections must
    /// present (`hostssl ... clientcert=verify-ca`); plain TCP connections are then refused.
    pub client_ca: Option<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            fast: true,
            max_connections: 300,
            tls: None,
            client_ca: None,
        }
    }
}

/// A Postgres cluster in a directory of ours, on a loopback port of ours.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
    stop_on_drop: bool,
}

impl Cluster {
    /// The cluster shared by every test of this checkout (`target/txoutbox-pg`), started if it is
    /// not running. Safe to call from many processes at once.
    pub fn shared() -> Result<Cluster> {
        let dir = target_dir().join("txoutbox-pg");
        Self::open(dir, &ClusterOptions::default(), false)
    }

    /// The cluster in `dir` (made if missing), left running when dropped, as the shared one is:
    /// for a test of what stops the tests' clusters (`./scripts/test --stop`) in a target
    /// directory of its own.
    pub fn open_in(dir: &Path, options: &ClusterOptions) -> Result<Cluster> {
        Self::open(dir.to_path_buf(), options, false)
    }

    /// A cluster of the caller's own in a new directory, stopped and removed when dropped; for
    /// tests that stop or restart Postgres, and for benchmarks.
    pub fn private(options: &ClusterOptions) -> Result<Cluster> {
        let dir = target_dir()
            .join("txoutbox-pg-private")
            .join(uuid::Uuid::new_v4().simple().to_string());
        Self::open(dir, options, true)
    }

    fn open(dir: PathBuf, options: &ClusterOptions, stop_on_drop: bool) -> Result<Cluster> {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let lock = File::create(dir.join("lock"))?;
        lock.lock().context("locking the cluster directory")?;
        let bin = server_bin_dir()?;
        let data = dir.join("data");
        let port_file = dir.join("port");
        if !data.join("PG_VERSION").exists() {
            let _ = fs::remove_dir_all(&data);
            fs::create_dir_all(&data)?;
            run_as_server_user(&bin.join("initdb"), &dir, |c| {
                c.arg("-D").arg(&data).args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                ]);
            })
            .context("initdb")?;
            fs::write(&port_file, free_port()?.to_string())?;
        }
        let port: u16 = fs::read_to_string(&port_file)
            .context("reading the cluster's port")?
            .trim()
            .parse()
            .context("parsing the cluster's port")?;
        let cluster = Cluster {
            dir,
            port,
            bin,
            stop_on_drop,
        };
        if !cluster.is_ready() {
            cluster.start_with(options)?;
        }
        drop(lock);
        Ok(cluster)
    }

    fn start_with(&self, options: &ClusterOptions) -> Result<()> {
        let mut settings = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections={} \
             -c shared_buffers=256MB",
            self.port,
            self.dir.display(),
            options.max_connections
        );
        if options.fast {
            settings.push_str(" -c fsync=off -c full_page_writes=off");
        }
        if let Some(tls) = &options.tls {
            // Postgres refuses a key others may read: 0600, owned by the server's user (the
            // cluster directory is given to that user before each pg_ctl).
            use std::os::unix::fs::PermissionsExt as _;
            let cert = self.dir.join("server.crt");
            let key = self.dir.join("server.key");
            fs::write(&cert, &tls.cert_pem)?;
            fs::write(&key, &tls.key_pem)?;
            fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
            settings.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            ));
            if let Some(client_ca) = &options.client_ca {
                let ca = self.dir.join("client-ca.crt");
                fs::write(&ca, client_ca)?;
                fs::write(
                    self.dir.join("data").join("pg_hba.conf"),
                    "local all all trust\n\
                     hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n\
                     hostssl all all ::1/128 trust clientcert=verify-ca\n",
                )?;
                settings.push_str(&format!(" -c ssl_ca_file={}", ca.display()));
            }
        }
        fs::write(self.dir.join("options"), &settings)?;
        self.pg_ctl_start()
    }

    fn pg_ctl_start(&self) -> Result<()> {
        let settings = fs::read_to_string(self.dir.join("options"))?;
        let log = self.dir.join("postgres.log");
        let data = self.dir.join("data");
        run_as_server_user(&self.bin.join("pg_ctl"), &self.dir, |c| {
            c.arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .arg("-o")
                .arg(&settings)
                .args(["-w", "-t", "60", "start"]);
        })
        .with_context(|| format!("pg_ctl start (log: {})", log.display()))?;
        self.wait_ready(Duration::from_secs(30))
    }

    /// Starts a stopped cluster again on the same port.
    pub fn start(&self) -> Result<()> {
        self.pg_ctl_start()
    }

    /// Stops the server at once (`-m immediate`: like a crash, no shutdown checkpoint).
    pub fn stop(&self) -> Result<()> {
        let data = self.dir.join("data");
        run_as_server_user(&self.bin.join("pg_ctl"), &self.dir, |c| {
            c.arg("-D")
                .arg(&data)
                .args(["-m", "immediate", "-w", "stop"]);
        })
    }

    /// Stops and starts the server.
    pub fn restart(&self) -> Result<()> {
        self.stop()?;
        self.start()
    }

    /// A [`private`](Cluster::private) cluster with the default options and a test database on
    /// it: what a test that stops or restarts Postgres opens with. Bound in this order
    /// (`let (cluster, db) = …`), the database is dropped before its cluster stops.
    pub async fn private_with_db() -> Result<(Cluster, crate::TestDb)> {
        let cluster = Cluster::private(&ClusterOptions::default())?;
        let db = crate::TestDb::create_on(&cluster.admin()).await?;
        Ok((cluster, db))
    }

    /// The superuser connection to the `postgres` database.
    pub fn admin(&self) -> ConnInfo {
        ConnInfo::tcp("127.0.0.1", self.port, "postgres", None, "postgres")
    }

    /// The cluster's directory (a place for a test's certificate files too).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The loopback port the cluster listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn is_ready(&self) -> bool {
        std::net::TcpStream::connect_timeout(
            &([127, 0, 0, 1], self.port).into(),
            Duration::from_millis(200),
        )
        .is_ok()
            && Command::new(self.bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
    }

    fn wait_ready(&self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        while !self.is_ready() {
            if start.elapsed() > limit {
                bail!("Postgres on port {} did not become ready", self.port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.stop_on_drop {
            let _ = self.stop();
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// `target/` of this workspace (or `CARGO_TARGET_DIR`).
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("target"))
}

/// The directory of `initdb` and `pg_ctl`: `PATH` first, then the newest `/usr/lib/postgresql/*/bin`.
fn server_bin_dir() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                // PATH may hold links (/usr/local/bin/initdb): the real directory has pg_isready.
                if let Some(real) = dir.join("initdb").canonicalize()?.parent() {
                    return Ok(real.to_path_buf());
                }
            }
        }
    }
    let mut found: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!(
            "no Postgres server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql; \
             install them (Debian: apt-get install postgresql) or set DATABASE_URL"
        ),
    }
}

/// Postgres refuses to run as root: as root, run the binaries as the `postgres` user and give
/// that user the cluster directory.
fn run_as_server_user(program: &Path, dir: &Path, args: impl FnOnce(&mut Command)) -> Result<()> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let mut command = if root {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .context("chown of the cluster directory to postgres")?;
        if !status.success() {
            bail!("chown -R postgres {} failed", dir.display());
        }
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    args(&mut command);
    crate::process::run_checked(&mut command, &program.display().to_string())?;
    Ok(())
}
