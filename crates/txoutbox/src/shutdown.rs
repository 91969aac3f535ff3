//! One stop signal for every background service of a process (the relay, a metrics server, an
//! HTTP server): each `run(shutdown)` takes [`Shutdown::wait`]'s future, and one trigger, by hand
//! or on SIGTERM/ctrl-c, stops them all.

use std::future::Future;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::watch;

/// A process's shutdown: [`trigger`](Self::trigger) it once, and every future handed out by
/// [`wait`](Self::wait), before or after, resolves. Clones share the one signal.
///
/// ```no_run
/// # async fn demo(relay: txoutbox::relay::Relay) -> Result<(), Box<dyn std::error::Error>> {
/// let shutdown = txoutbox::relay::Shutdown::on_signal()?; // SIGTERM or ctrl-c
/// let report = relay.run(shutdown.wait()).await?;  // returns when drained
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Shutdown {
    sender: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A shutdown not yet triggered.
    pub fn new() -> Self {
        Self {
            sender: Arc::new(watch::channel(false).0),
        }
    }

    /// A shutdown triggered by the process's first SIGINT or SIGTERM (ctrl-c off Unix). The
    /// handlers are installed at once, so a signal that arrives while a service is still
    /// starting stops it gracefully instead of killing the process. Needs a Tokio runtime.
    pub fn on_signal() -> std::io::Result<Self> {
        let shutdown = Self::new();
        shutdown.trigger_on(signalled()?);
        Ok(shutdown)
    }

    /// Triggers this shutdown when `event` resolves (on a task of its own).
    pub fn trigger_on(&self, event: impl Future + Send + 'static) {
        let shutdown = self.clone();
        tokio::spawn(async move {
            event.await;
            shutdown.trigger();
        });
    }

    /// Stops every service waiting on this shutdown; triggering twice is triggering once.
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// Whether [`trigger`](Self::trigger) was called.
    pub fn is_triggered(&self) -> bool {
        *self.sender.borrow()
    }

    /// A future that resolves once this shutdown is triggered: the `shutdown` argument of a
    /// service's `run`. It can be cloned, one clone for each part of a service.
    pub fn wait(&self) -> impl Future<Output = ()> + Clone + Send + Sync + 'static {
        let mut receiver = self.sender.subscribe();
        let wait: BoxFuture<'static, ()> = Box::pin(async move {
            // Every sender gone: nobody is left to trigger it, and waiting would never end.
            let _ = receiver.wait_for(|stop| *stop).await;
        });
        let shared: Shared<BoxFuture<'static, ()>> = wait.shared();
        shared
    }
}

/// Installs the SIGINT and SIGTERM handlers (ctrl-c off Unix); the future resolves on the first.
fn signalled() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Shutdown;

    #[tokio::test]
    async fn every_waiter_resolves_once_triggered() {
        let shutdown = Shutdown::new();
        let early = shutdown.wait();
        let copy = early.clone();
        assert!(!shutdown.is_triggered());
        shutdown.clone().trigger();
        early.await;
        copy.await;
        shutdown.wait().await;
        assert!(shutdown.is_triggered());
    }
}
