//! The queue and its uploader thread as one piece, shared by the profile exporters
//! (Pyroscope push, OTLP profiles): start, enqueue, and shut down within a timeout.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::queue::{Enqueued, Shared};
use super::stats::PyroscopeStats;
use super::uploader::{self, ClientError, Protocol, UploadSettings};
use crate::fork::ProcessBound;

/// How much longer than the shutdown timeout `drop` waits for the uploader to finish on its
/// own before leaving it behind.
const DROP_SLACK: Duration = Duration::from_millis(200);

/// Why the pipeline could not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The client could not be built (TLS setup, gRPC endpoint).
    Client(ClientError),
    /// The thread could not be started, or ended while starting.
    Thread(std::io::Error),
}

/// A bounded queue of encoded requests and the thread that sends them. It belongs to the
/// process that started it: a forked child's copy has no thread behind it, and the queue's
/// lock may be held by that thread, so there it is left untouched (see `crate::fork`).
pub(crate) struct Pipeline {
    /// The counters (the queue's own, shared): readable in a child, which reads the
    /// parent's figures up to the fork.
    stats: Arc<PyroscopeStats>,
    running: ProcessBound<Running>,
}

struct Running {
    shared: Arc<Shared>,
    what: &'static str,
    shutdown_timeout: Duration,
    thread: Option<JoinHandle<()>>,
    done: mpsc::Receiver<()>,
}

impl Pipeline {
    /// Starts the thread `thread_name` sending with `protocol` to `settings.endpoint`.
    pub(crate) fn start(
        settings: UploadSettings,
        protocol: Box<dyn Protocol>,
        max_queue_bytes: usize,
        shutdown_timeout: Duration,
        thread_name: &str,
    ) -> Result<Pipeline, StartError> {
        let what = protocol.what();
        let shared = Arc::new(Shared::new(max_queue_bytes));
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let (done_tx, done) = mpsc::sync_channel(1);
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                let _own = crate::collector::own_thread();
                uploader::run(settings, protocol, thread_shared, ready_tx, done_tx)
            })
            .map_err(StartError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(StartError::Client(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(StartError::Thread(std::io::Error::other(
                    "the uploader thread ended while starting",
                )));
            }
        }
        Ok(Pipeline {
            stats: shared.stats.clone(),
            running: ProcessBound::new(Running {
                shared,
                what,
                shutdown_timeout,
                thread: Some(thread),
                done,
            }),
        })
    }

    /// The counters.
    pub(crate) fn stats(&self) -> &Arc<PyroscopeStats> {
        &self.stats
    }

    /// Queues one encoded request; `Err` says why it was dropped (already counted).
    pub(crate) fn enqueue(&self, body: Vec<u8>) -> std::io::Result<()> {
        let Some(running) = self.running.get() else {
            return Err(std::io::Error::other(
                "profile exporter inherited through fork: start a profiler in the child",
            ));
        };
        let what = running.what;
        let error = match running.shared.enqueue(body) {
            Enqueued::Queued => return Ok(()),
            Enqueued::TooLarge { size, max } => format!(
                "{what}: profile request of {size} bytes exceeds max_queue_bytes ({max}); dropped"
            ),
            Enqueued::Stopped => format!("{what}: the uploader has stopped; profile dropped"),
        };
        Err(std::io::Error::other(error))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let deadline = Instant::now() + self.shutdown_timeout;
        self.shared.begin_shutdown(deadline);
        match self.done.recv_timeout(self.shutdown_timeout + DROP_SLACK) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(thread) = self.thread.take() {
                    // The thread signals `done` as its very last step: this join is short.
                    let _ = thread.join();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                // Stuck in a request that started before the shutdown: leave it behind.
                let dropped = self.shared.abandon();
                eprintln!(
                    "otel-profiling: {} uploader did not finish within the shutdown \
                     timeout ({:?}); {dropped} queued profile(s) dropped",
                    self.what, self.shutdown_timeout
                );
                self.thread.take();
            }
        }
    }
}
