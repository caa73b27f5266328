//! Rate-limited failure lines: the first at once, then at most one a minute, each saying
//! how many were held back. Shared by the exporters so a dead backend never floods stderr.

use std::time::{Duration, Instant};

/// At most one failure line per this long (the first failure is always logged).
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(60);

/// The first failure, then at most one line per [`LOG_EVERY`].
#[derive(Debug, Default)]
pub(crate) struct LogLimiter {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    /// `Some(lines suppressed since the last one)` if a line may be written now.
    pub(crate) fn permit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < LOG_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_limiter_allows_the_first_then_one_a_minute() {
        let mut log = LogLimiter::default();
        let t0 = Instant::now();
        assert_eq!(log.permit(t0), Some(0));
        assert_eq!(log.permit(t0 + Duration::from_secs(1)), None);
        assert_eq!(log.permit(t0 + Duration::from_secs(59)), None);
        assert_eq!(log.permit(t0 + Duration::from_secs(61)), Some(2));
        assert_eq!(log.permit(t0 + Duration::from_secs(62)), None);
    }
}
