//! The replica's background tasks — self-managed TLS, the cluster watches, the reloader —
//! stopped when it terminates instead of running on until the process exits.
//!
//! Two moments: tasks that write to the cluster (self-managed TLS: the Secret and the
//! caBundles) stop at the shutdown signal, because a terminating replica hands those over to
//! the replicas replacing it (which may run another version, or another TLS mode, and must not
//! be fought); tasks that keep this replica's answers right (the cluster watches, the
//! configuration and certificate reloads) run through the drain, so the requests still in
//! flight are decided as before, and stop after it. Either way a stopped task is dropped at
//! its next await point, and the shutdown waits for all of them.

use std::{future::Future, time::Duration};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// When a background task stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// At the shutdown signal, before the drain: tasks that write to the cluster.
    Signal,
    /// After the drain: tasks that keep the replica's answers right while it drains.
    Exit,
}

/// The background tasks of one `serve`.
#[derive(Clone, Debug, Default)]
pub struct Background {
    signal: CancellationToken,
    exit: CancellationToken,
    tracker: TaskTracker,
}

impl Background {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` until it ends or its moment comes.
    pub fn spawn<F>(&self, until: Until, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = match until {
            Until::Signal => self.signal.clone(),
            Until::Exit => self.exit.clone(),
        };
        self.tracker.spawn(async move {
            if token.run_until_cancelled(task).await.is_none() {
                tracing::debug!(task = name, "background task stopped");
            }
        });
    }

    /// The shutdown signal: the tasks that write to the cluster stop now.
    pub fn signal(&self) {
        self.signal.cancel();
    }

    /// After the drain: every task stops; waits up to `within` for them. False when some
    /// did not stop in time (the process exits all the same).
    pub async fn stop(&self, within: Duration) -> bool {
        self.signal.cancel();
        self.exit.cancel();
        self.tracker.close();
        tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Tasks still running.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;

    /// A task that counts once a second until it is dropped.
    async fn ticking(count: Arc<AtomicU32>) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            count.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writers_stop_at_the_signal_and_the_rest_after_the_drain() {
        let bg = Background::new();
        let (writer, watcher) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        bg.spawn(Until::Signal, "writer", ticking(writer.clone()));
        bg.spawn(Until::Exit, "watcher", ticking(watcher.clone()));
        bg.spawn(Until::Exit, "short", async {});
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert_eq!(
            (
                writer.load(Ordering::SeqCst),
                watcher.load(Ordering::SeqCst)
            ),
            (3, 3)
        );
        assert_eq!(bg.running(), 2, "a task that ended is not waited for");

        bg.signal();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            writer.load(Ordering::SeqCst),
            3,
            "no write after the signal"
        );
        assert_eq!(
            watcher.load(Ordering::SeqCst),
            8,
            "the watches run through the drain"
        );
        assert_eq!(bg.running(), 1);

        assert!(bg.stop(Duration::from_secs(1)).await);
        assert_eq!(bg.running(), 0);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(watcher.load(Ordering::SeqCst), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_never_yields_to_its_token_is_reported_not_waited_for_forever() {
        let bg = Background::new();
        // Cancellation drops a task at an await point; one stuck in a blocking call is not.
        bg.tracker.spawn(async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        assert!(!bg.stop(Duration::from_secs(2)).await);
    }
}
