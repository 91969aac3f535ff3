//! `./scripts/test --stop`: one command stops what the tests leave running (the shared Postgres
//! cluster, the nats-server the script started), run as root or as the user who owns them.
//! Each test works in a target directory of its own (`CARGO_TARGET_DIR` for the script), never
//! in the one the other tests share.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use txoutbox_test_support::{free_port, Cluster, ClusterOptions};

/// A target directory under the workspace's `target/tmp`, which the `postgres` user may enter
/// (the cluster runs as that user when the tests run as root).
fn own_target() -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp");
    std::fs::create_dir_all(&root)?;
    let dir = tempfile::Builder::new().prefix("stop-").tempdir_in(root)?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test")
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn succeeded(out: &Output) -> bool {
    out.status.success()
}

/// `nats-server` on PATH, else Debian's.
fn nats_server() -> PathBuf {
    let debian = PathBuf::from("/usr/sbin/nats-server");
    if debian.is_file() {
        debian
    } else {
        PathBuf::from("nats-server")
    }
}

/// A cluster stopped when the test ends, whatever happened (its directory is removed after).
struct Stopped(Cluster);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.stop();
    }
}

/// Waits (at most 10 s) for `child` to exit; true when it did.
fn exited(child: &mut Child) -> anyhow::Result<bool> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if child.try_wait()?.is_some() {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    Ok(false)
}

#[test]
fn scripts_test_stop_stops_the_shared_cluster_and_the_nats_server_it_started() -> anyhow::Result<()>
{
    let target = own_target()?;
    let cluster = Stopped(Cluster::open_in(
        &target.path().join("txoutbox-pg"),
        &ClusterOptions::default(),
    )?);
    let nats_port = free_port()?;
    let mut nats = Command::new(nats_server())
        .args(["-a", "127.0.0.1", "-p", &nats_port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    std::fs::create_dir_all(target.path().join("txoutbox-nats"))?;
    std::fs::write(
        target.path().join("txoutbox-nats/pid"),
        nats.id().to_string(),
    )?;
    let start = Instant::now();
    while !listening(nats_port) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(listening(cluster.0.port()) && listening(nats_port));

    let out = Command::new(script())
        .arg("--stop")
        .env("CARGO_TARGET_DIR", target.path())
        .output()?;
    assert!(succeeded(&out), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!listening(cluster.0.port()), "Postgres is stopped");
    assert!(exited(&mut nats)?, "nats-server is stopped");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("stopped Postgres") && said.contains("stopped nats-server"),
        "{said}"
    );
    Ok(())
}

#[test]
fn scripts_test_stop_run_by_the_clusters_own_user_stops_it() -> anyhow::Result<()> {
    let target = own_target()?;
    let cluster = Stopped(Cluster::open_in(
        &target.path().join("txoutbox-pg"),
        &ClusterOptions::default(),
    )?);
    assert!(listening(cluster.0.port()));
    // As root the cluster belongs to `postgres` (Postgres refuses root): run the script as that
    // user; as a user, the cluster is the user's own.
    let mut command = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(script());
        c
    } else {
        Command::new(script())
    };
    let out = command
        .arg("--stop")
        .env("CARGO_TARGET_DIR", target.path())
        .output()?;
    assert!(succeeded(&out), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!listening(cluster.0.port()), "Postgres is stopped");
    Ok(())
}
