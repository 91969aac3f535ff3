//! The relay processes (`txoutbox relay`) and the operator's commands run beside them. Each
//! relay incarnation has an owner name of its own (`soak-r<slot>-g<generation>`), so the attempt
//! log tells which process held a lease, and which of them were SIGKILLed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::process::{Child, Command};

/// How to start a relay.
#[derive(Debug, Clone)]
pub struct RelaySpec {
    /// The `txoutbox` binary.
    pub bin: PathBuf,
    /// The database the relays serve.
    pub database_url: String,
    /// The flags every relay gets (sinks, lease, backoff).
    pub args: Vec<String>,
    /// Where the relays' logs go.
    pub log_dir: PathBuf,
    /// The relays' `--shutdown-grace`.
    pub grace: Duration,
}

/// How a relay ended after a SIGTERM (or without being asked).
#[derive(Debug, Clone)]
pub struct Exit {
    /// The relay's owner name.
    pub owner: String,
    /// Its exit status (`None`: it did not exit and was SIGKILLed).
    pub status: Option<ExitStatus>,
    /// From the SIGTERM to the exit.
    pub took: Duration,
    /// False when the relay exited without being asked.
    pub asked: bool,
    /// The end of its log, for the report.
    pub log_tail: String,
}

struct Slot {
    generation: u32,
    owner: String,
    child: Option<Child>,
    log: PathBuf,
    started: Instant,
    quick_deaths: u32,
}

/// The relays of one run.
pub struct Fleet {
    spec: RelaySpec,
    slots: Vec<Slot>,
    /// Owners that were SIGKILLed (their cut-short attempts may legitimately be `unknown`).
    pub killed: HashSet<String>,
    /// Every exit after a SIGTERM, and every exit nobody asked for.
    pub exits: Vec<Exit>,
}

impl Fleet {
    /// Starts `n` relays.
    pub fn start(spec: RelaySpec, n: usize) -> Result<Fleet> {
        let mut fleet = Fleet {
            spec,
            slots: Vec::new(),
            killed: HashSet::new(),
            exits: Vec::new(),
        };
        for i in 0..n {
            let slot = fleet.spawn(i, 0)?;
            fleet.slots.push(slot);
        }
        Ok(fleet)
    }

    fn spawn(&self, index: usize, generation: u32) -> Result<Slot> {
        let owner = format!("soak-r{index}-g{generation}");
        let log = self.spec.log_dir.join(format!("{owner}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(&self.spec.bin)
            .arg("relay")
            .args(&self.spec.args)
            .args(["--owner", &owner])
            .env("DATABASE_URL", &self.spec.database_url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.spec.bin.display()))?;
        Ok(Slot {
            generation,
            owner,
            child: Some(child),
            log,
            started: Instant::now(),
            quick_deaths: 0,
        })
    }

    fn restart(&mut self, index: usize) -> Result<()> {
        let (generation, quick) = match self.slots.get(index) {
            Some(s) => (s.generation + 1, s.quick_deaths),
            None => return Ok(()),
        };
        let mut slot = self.spawn(index, generation)?;
        slot.quick_deaths = quick;
        self.slots[index] = slot;
        Ok(())
    }

    /// Number of relay slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True without slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// SIGKILLs relay `index` and starts a new one in its place.
    pub async fn sigkill(&mut self, index: usize) -> Result<()> {
        let Some(slot) = self.slots.get_mut(index) else {
            return Ok(());
        };
        if let Some(mut child) = slot.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
            self.killed.insert(slot.owner.clone());
        }
        self.restart(index)
    }

    /// SIGTERMs relay `index`, waits for it (SIGKILL after grace + 5 s), and starts a new one.
    pub async fn sigterm(&mut self, index: usize) -> Result<()> {
        self.stop(index).await;
        self.restart(index)
    }

    async fn stop(&mut self, index: usize) {
        let limit = self.spec.grace + Duration::from_secs(5);
        let Some(slot) = self.slots.get_mut(index) else {
            return;
        };
        // A relay is signalled mid-run, not mid-start: before its handler is installed, SIGTERM
        // ends a process with the default action, which says nothing about the relay.
        let age = slot.started.elapsed();
        if age < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_secs(1) - age).await;
        }
        let Some(child) = slot.child.take() else {
            return;
        };
        let exit = terminate(child, limit, slot.owner.clone(), slot.log.clone()).await;
        if exit.status.is_none() {
            self.killed.insert(exit.owner.clone());
        }
        self.exits.push(exit);
    }

    /// Stops every relay with SIGTERM, all at once.
    pub async fn stop_all(&mut self) {
        let limit = self.spec.grace + Duration::from_secs(5);
        let mut waits = Vec::new();
        for slot in &mut self.slots {
            if let Some(child) = slot.child.take() {
                waits.push(terminate(
                    child,
                    limit,
                    slot.owner.clone(),
                    slot.log.clone(),
                ));
            }
        }
        for exit in futures::future::join_all(waits).await {
            if exit.status.is_none() {
                self.killed.insert(exit.owner.clone());
            }
            self.exits.push(exit);
        }
    }

    /// Notices relays that exited unasked, records them, and starts new ones. Fails when a relay
    /// cannot stay up (it exits within 2 s of its start three times running).
    pub fn check(&mut self) -> Result<()> {
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            let Some(child) = slot.child.as_mut() else {
                continue;
            };
            let Ok(Some(status)) = child.try_wait() else {
                continue;
            };
            slot.child = None;
            let quick = slot.started.elapsed() < Duration::from_secs(2);
            slot.quick_deaths = if quick { slot.quick_deaths + 1 } else { 0 };
            let log_tail = tail(&slot.log);
            self.exits.push(Exit {
                owner: slot.owner.clone(),
                status: Some(status),
                took: Duration::ZERO,
                asked: false,
                log_tail: log_tail.clone(),
            });
            if slot.quick_deaths >= 3 {
                anyhow::bail!(
                    "relay {} cannot start ({status}); its log ends with:\n{log_tail}",
                    slot.owner
                );
            }
            self.restart(index)?;
        }
        Ok(())
    }

    /// Runs one of the operator's commands (`txoutbox replay …`, `txoutbox purge …`) with a
    /// 30 s limit; returns its status and output.
    pub async fn admin(&self, args: &[String]) -> Result<(bool, String)> {
        let run = Command::new(&self.spec.bin)
            .args(args)
            .env("DATABASE_URL", &self.spec.database_url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(Duration::from_secs(30), run).await {
            Ok(out) => {
                let out = out?;
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                Ok((out.status.success(), text))
            }
            Err(_) => Ok((false, "timed out after 30 s".to_owned())),
        }
    }
}

/// The last lines of a log file.
/// SIGTERMs a relay and waits for it, SIGKILLing it after twice `limit` (a relay that overruns
/// its limit gets a little longer, to measure by how much): its exit, asked for.
async fn terminate(mut child: Child, limit: Duration, owner: String, log: PathBuf) -> Exit {
    let began = Instant::now();
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    let status = match tokio::time::timeout(limit * 2, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    };
    Exit {
        owner,
        status,
        took: began.elapsed(),
        asked: true,
        log_tail: tail(&log),
    }
}

fn tail(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}
