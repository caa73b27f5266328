//! Percentiles of wall times.

/// The nearest-rank percentile `p` (0–100) of `sorted` (ascending): the smallest value
/// with at least `p` % of the values at or below it; 0 for an empty slice.
///
/// Nearest-rank returns a value that was measured, never an interpolation: p50 of
/// `[10, 20, 30, 40]` is 20 and p95 is 40.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank() {
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(percentile(&[7], 95.0), 7);
        assert_eq!(percentile(&[10, 20, 30, 40], 50.0), 20);
        assert_eq!(percentile(&[10, 20, 30, 40], 95.0), 40);
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&hundred, 50.0), 50);
        assert_eq!(percentile(&hundred, 95.0), 95);
        assert_eq!(percentile(&hundred, 0.0), 1);
    }
}
