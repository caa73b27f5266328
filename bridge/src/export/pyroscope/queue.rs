//! The bounded queue between `export` (the collector's encoder thread) and the uploader thread.
//!
//! One mutex guards the queue; neither side holds it while encoding, compressing or
//! talking to the network, so `export` never waits for more than a few list operations.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;

use super::stats::PyroscopeStats;

/// One queued push request.
#[derive(Debug)]
struct Item {
    /// The encoded `PushRequest`; gzipped once the uploader first took it.
    body: Bytes,
    /// Whether `body` is gzipped already.
    compressed: bool,
    /// Bytes counted against the bound (the encoded size, before compression).
    size: usize,
    /// Attempts made so far.
    attempts: u32,
    /// Not to be sent before this instant (backoff).
    not_before: Option<Instant>,
}

#[derive(Debug, Default)]
struct QueueState {
    items: VecDeque<Item>,
    /// Sum of `size` over `items`.
    bytes: usize,
    /// The front item is being sent: it may not be pushed out.
    in_flight: bool,
    /// Set by the exporter's `drop`: send until this instant, then stop.
    shutdown: Option<Instant>,
    /// Set when `drop` stopped waiting: the uploader must not touch the counters again.
    abandoned: bool,
    /// The uploader thread has ended.
    stopped: bool,
}

/// What `enqueue` did with a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// Queued (older requests may have been pushed out for it).
    Queued,
    /// Refused: it cannot fit, either alone or beside the request being sent.
    TooLarge {
        /// Its size.
        size: usize,
        /// The room available for it.
        max: usize,
    },
    /// Refused: the uploader has stopped or is stopping.
    Stopped,
}

/// What the uploader should do next.
#[derive(Debug)]
pub(crate) enum Take {
    /// Send the front request (now marked in flight).
    Send {
        /// The request body.
        body: Bytes,
        /// Whether `body` is gzipped already.
        compressed: bool,
        /// Attempts made before this one.
        attempts: u32,
        /// The shutdown deadline, if shutting down.
        deadline: Option<Instant>,
    },
    /// Stop: shut down (what was left is counted as dropped) or abandoned.
    Exit {
        /// Requests dropped because the shutdown deadline passed.
        dropped: u64,
    },
}

/// How the attempt on the front request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Accepted by the server.
    Sent,
    /// Refused for good.
    Failed,
    /// To be retried, not before this instant.
    Retry(Instant),
    /// Attempts exhausted: dropped.
    GaveUp,
    /// Replaced by these smaller requests (uncompressed), sent in its place and order, not
    /// before this instant (a 429 for a request too large for the server's burst).
    Split(Vec<Vec<u8>>, Instant),
}

/// State shared by the exporter and its uploader thread.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<QueueState>,
    wake: Condvar,
    max_bytes: usize,
    pub(crate) stats: Arc<PyroscopeStats>,
}

impl Shared {
    pub(crate) fn new(max_bytes: usize) -> Shared {
        Shared {
            state: Mutex::new(QueueState::default()),
            wake: Condvar::new(),
            max_bytes,
            stats: Arc::new(PyroscopeStats::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Mirrors the queue's length and size into the counters (under the lock, so they
    /// never disagree with the queue for long).
    fn publish(&self, state: &QueueState) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stats
            .profiles_queued
            .store(state.items.len() as u64, Relaxed);
        self.stats.bytes_queued.store(state.bytes as u64, Relaxed);
    }

    fn count_dropped(&self, n: u64) {
        if n > 0 {
            PyroscopeStats::add(&self.stats.profiles_dropped, n);
        }
    }

    /// Queues `body`, pushing out the oldest requests (not the one in flight) to make room.
    pub(crate) fn enqueue(&self, body: Vec<u8>) -> Enqueued {
        let size = body.len();
        let mut state = self.lock();
        if state.stopped || state.abandoned || state.shutdown.is_some() {
            drop(state);
            self.count_dropped(1);
            return Enqueued::Stopped;
        }
        let pinned = match state.items.front() {
            Some(front) if state.in_flight => front.size,
            _ => 0,
        };
        let room = self.max_bytes.saturating_sub(pinned);
        if size > room {
            drop(state);
            self.count_dropped(1);
            return Enqueued::TooLarge { size, max: room };
        }
        // The uploader only waits on the front request: wake it only if the front changes
        // (fewer wake-ups, fewer context switches on the caller's core).
        let mut front_changed = state.items.is_empty();
        let mut pushed_out = 0;
        while state.bytes + size > self.max_bytes {
            let oldest = usize::from(state.in_flight);
            front_changed |= oldest == 0;
            match state.items.remove(oldest) {
                Some(old) => {
                    state.bytes -= old.size;
                    pushed_out += 1;
                }
                None => break,
            }
        }
        state.items.push_back(Item {
            body: Bytes::from(body),
            compressed: false,
            size,
            attempts: 0,
            not_before: None,
        });
        state.bytes += size;
        self.publish(&state);
        drop(state);
        self.count_dropped(pushed_out);
        if front_changed {
            self.wake.notify_one();
        }
        Enqueued::Queued
    }

    /// Waits for the next request to send (uploader thread).
    pub(crate) fn take(&self) -> Take {
        let mut state = self.lock();
        loop {
            if state.abandoned {
                return Take::Exit { dropped: 0 };
            }
            let now = Instant::now();
            if let Some(deadline) = state.shutdown {
                if state.items.is_empty() || now >= deadline {
                    let dropped = self.drop_all(&mut state);
                    return Take::Exit { dropped };
                }
            }
            let wait_until = match state.items.front() {
                None => None,
                Some(item) => match item.not_before {
                    Some(t) if t > now => Some(t),
                    _ => {
                        let take = Take::Send {
                            body: item.body.clone(),
                            compressed: item.compressed,
                            attempts: item.attempts,
                            deadline: state.shutdown,
                        };
                        if item.attempts > 0 {
                            PyroscopeStats::add(&self.stats.retries, 1);
                        }
                        state.in_flight = true;
                        return take;
                    }
                },
            };
            let wait_until = match (wait_until, state.shutdown) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            state = match wait_until {
                None => self
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(t) => {
                    self.wake
                        .wait_timeout(state, t.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    /// Records how the attempt on the front request ended (uploader thread). `gzipped` is
    /// the compressed body made for the first attempt, kept for retries.
    pub(crate) fn complete(&self, outcome: Outcome, gzipped: Option<Bytes>) {
        let mut state = self.lock();
        state.in_flight = false;
        if state.abandoned {
            return;
        }
        let Some(front) = state.items.front_mut() else {
            return;
        };
        let counter = match outcome {
            Outcome::Split(parts, not_before) => {
                let attempts = front.attempts + 1;
                if let Some(replaced) = state.items.pop_front() {
                    state.bytes -= replaced.size;
                }
                let mut kept_parts = parts.len();
                for body in parts.into_iter().rev() {
                    let size = body.len();
                    state.bytes += size;
                    state.items.push_front(Item {
                        body: Bytes::from(body),
                        compressed: false,
                        size,
                        attempts,
                        not_before: Some(not_before),
                    });
                }
                // Each part carries its own framing, so the parts outweigh the request
                // they replace: make room as `enqueue` does, oldest first after the parts,
                // then the last parts, so that the bound holds after a split too.
                let mut pushed_out = 0;
                while state.bytes > self.max_bytes {
                    let oldest = if state.items.len() > kept_parts {
                        kept_parts
                    } else {
                        kept_parts = kept_parts.saturating_sub(1);
                        kept_parts
                    };
                    match state.items.remove(oldest) {
                        Some(old) => {
                            state.bytes -= old.size;
                            pushed_out += 1;
                        }
                        None => break,
                    }
                }
                PyroscopeStats::add(&self.stats.pushes_split, 1);
                self.publish(&state);
                self.count_dropped(pushed_out);
                return;
            }
            Outcome::Retry(not_before) => {
                front.attempts += 1;
                front.not_before = Some(not_before);
                if let Some(body) = gzipped {
                    front.body = body;
                    front.compressed = true;
                }
                return;
            }
            Outcome::Sent => &self.stats.profiles_sent,
            Outcome::Failed => &self.stats.profiles_failed,
            Outcome::GaveUp => &self.stats.profiles_dropped,
        };
        if let Some(done) = state.items.pop_front() {
            state.bytes -= done.size;
        }
        PyroscopeStats::add(counter, 1);
        self.publish(&state);
    }

    /// Asks the uploader to send what is queued until `deadline`, then stop.
    pub(crate) fn begin_shutdown(&self, deadline: Instant) {
        let mut state = self.lock();
        if state.shutdown.is_none() {
            state.shutdown = Some(deadline);
        }
        drop(state);
        self.wake.notify_all();
    }

    /// Gives up on the uploader: counts what is queued (the request in flight included)
    /// as dropped. Returns how many.
    pub(crate) fn abandon(&self) -> u64 {
        let mut state = self.lock();
        let dropped = self.drop_all(&mut state);
        state.abandoned = true;
        drop(state);
        self.wake.notify_all();
        dropped
    }

    /// The uploader thread has ended: nothing more will be sent.
    pub(crate) fn mark_stopped(&self) {
        let mut state = self.lock();
        state.stopped = true;
        if !state.abandoned {
            self.drop_all(&mut state);
        }
    }

    fn drop_all(&self, state: &mut QueueState) -> u64 {
        let n = state.items.len() as u64;
        state.items.clear();
        state.bytes = 0;
        state.in_flight = false;
        self.publish(state);
        self.count_dropped(n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn snapshot(shared: &Shared) -> (u64, u64, u64) {
        let s = shared.stats.snapshot();
        (s.profiles_queued, s.bytes_queued, s.profiles_dropped)
    }

    #[test]
    fn oldest_are_pushed_out_but_not_the_one_in_flight() {
        let shared = Shared::new(100);
        for fill in 0..3u8 {
            assert_eq!(shared.enqueue(vec![fill; 30]), Enqueued::Queued);
        }
        assert_eq!(snapshot(&shared), (3, 90, 0));
        let Take::Send { body, .. } = shared.take() else {
            panic!("expected a request")
        };
        assert_eq!(body[0], 0);
        // 90 + 30 > 100: the oldest queued (fill 1) goes, the in-flight one (fill 0) stays.
        assert_eq!(shared.enqueue(vec![3; 30]), Enqueued::Queued);
        assert_eq!(snapshot(&shared), (3, 90, 1));
        // Larger than the room beside the in-flight request: refused.
        assert_eq!(
            shared.enqueue(vec![4; 71]),
            Enqueued::TooLarge { size: 71, max: 70 }
        );
        assert_eq!(snapshot(&shared), (3, 90, 2));
        shared.complete(Outcome::Sent, None);
        assert_eq!(snapshot(&shared), (2, 60, 2));
        let Take::Send { body, .. } = shared.take() else {
            panic!("expected a request")
        };
        assert_eq!(body[0], 2);
    }

    /// Audit U11: the parts of a split request (framing repeated in each) went over the
    /// bound until the next `enqueue`. Older requests make room now, then the last parts.
    #[test]
    fn a_split_stays_within_the_bound() {
        let shared = Shared::new(100);
        assert_eq!(shared.enqueue(vec![1; 60]), Enqueued::Queued);
        assert_eq!(shared.enqueue(vec![2; 30]), Enqueued::Queued);
        let _ = shared.take();
        assert_eq!(shared.enqueue(vec![3; 10]), Enqueued::Queued);
        let later = Instant::now();
        shared.complete(Outcome::Split(vec![vec![4; 35], vec![5; 35]], later), None);
        // 35 + 35 + 30 + 10 > 100: the oldest request after the parts (fill 2) goes.
        assert_eq!(snapshot(&shared), (3, 80, 1));
        let Take::Send { body, .. } = shared.take() else {
            panic!("expected a request")
        };
        assert_eq!(body[0], 4);
        shared.complete(Outcome::Sent, None);
        let Take::Send { body, .. } = shared.take() else {
            panic!("expected a request")
        };
        assert_eq!(body[0], 5);

        // Nothing else to push out: the last part goes.
        let shared = Shared::new(100);
        assert_eq!(shared.enqueue(vec![1; 100]), Enqueued::Queued);
        let _ = shared.take();
        shared.complete(Outcome::Split(vec![vec![4; 55], vec![5; 55]], later), None);
        assert_eq!(snapshot(&shared), (1, 55, 1));
    }

    #[test]
    fn retry_waits_and_keeps_the_gzipped_body() {
        let shared = Shared::new(100);
        assert_eq!(shared.enqueue(vec![1; 10]), Enqueued::Queued);
        let Take::Send { attempts, .. } = shared.take() else {
            panic!("expected a request")
        };
        assert_eq!(attempts, 0);
        let until = Instant::now() + Duration::from_millis(30);
        shared.complete(Outcome::Retry(until), Some(Bytes::from_static(b"gz")));
        let Take::Send {
            body,
            compressed,
            attempts,
            ..
        } = shared.take()
        else {
            panic!("expected a request")
        };
        assert!(Instant::now() >= until);
        assert_eq!((&body[..], compressed, attempts), (&b"gz"[..], true, 1));
        assert_eq!(shared.stats.snapshot().retries, 1);
    }

    #[test]
    fn shutdown_drops_what_is_left_at_the_deadline() {
        let shared = Shared::new(100);
        shared.enqueue(vec![1; 10]);
        shared.enqueue(vec![2; 10]);
        let _ = shared.take();
        shared.complete(
            Outcome::Retry(Instant::now() + Duration::from_secs(60)),
            None,
        );
        shared.begin_shutdown(Instant::now() + Duration::from_millis(20));
        assert!(matches!(shared.take(), Take::Exit { dropped: 2 }));
        assert_eq!(snapshot(&shared), (0, 0, 2));
        assert_eq!(shared.enqueue(vec![3; 10]), Enqueued::Stopped);
        assert_eq!(snapshot(&shared), (0, 0, 3));
    }
}
