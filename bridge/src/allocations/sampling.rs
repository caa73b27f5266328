//! Poisson sampling by bytes: where the next sample falls, and what a sample stands for.
//!
//! Every allocated byte is a trial with probability `1 / mean`: the bytes between two
//! samples are exponential with mean `mean`, so a thread keeps one countdown, drawn
//! afresh after each sample, and an allocation is sampled when it takes the countdown to
//! zero. An allocation of `size` bytes is then sampled with probability
//! `p = 1 - exp(-size / mean)` (the exponential is memoryless: where the last sample fell
//! does not matter), and a sample weighted `size / p` bytes and `1 / p` objects makes
//! both totals unbiased, for a 16-byte allocation (`p ≈ size / mean`, weight ≈ `mean`)
//! and for a 64 MiB one (`p ≈ 1`, weight ≈ its size) alike. This is the scheme of
//! tcmalloc and Go's heap profiler.

/// A small per-thread generator (xorshift64*): enough for exponential draws, and its
/// state is one word a `const` thread-local holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` (any value; zero is mapped to a fixed odd one).
    pub(crate) const fn new(seed: u64) -> Rng {
        // splitmix64's finaliser spreads a small seed (a thread id) over the word.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `(0, 1]`: 53 random bits, never zero (its logarithm is finite).
    fn open_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}

/// Bytes until the next sample: exponential with mean `mean` (at least 1).
pub(crate) fn next_countdown(rng: &mut Rng, mean: u64) -> i64 {
    let bytes = -rng.open_unit().ln() * mean as f64;
    // At most 53 × ln 2 ≈ 36.7 means: far below i64::MAX for any mean the setting takes.
    (bytes as i64).max(1)
}

/// What one sampled allocation of `size` bytes stands for: (bytes, objects), the inverse
/// of its probability of being sampled at `mean`.
pub(crate) fn weights(size: u64, mean: u64) -> (f64, f64) {
    let ratio = size as f64 / mean.max(1) as f64;
    // 1 - exp(-ratio), without the cancellation of a tiny ratio.
    let p = -(-ratio).exp_m1();
    if p <= 0.0 {
        // size 0: nothing allocated, nothing to stand for.
        return (0.0, 0.0);
    }
    (size as f64 / p, 1.0 / p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn countdowns_are_exponential_with_the_mean() {
        let mut rng = Rng::new(7);
        let mean = 512 * 1024;
        let n = 200_000;
        let draws: Vec<f64> = (0..n)
            .map(|_| next_countdown(&mut rng, mean) as f64)
            .collect();
        let average = draws.iter().sum::<f64>() / n as f64;
        // Standard error of the mean of an exponential: mean / sqrt(n) = 0.22 %.
        assert!((average / mean as f64 - 1.0).abs() < 0.01, "{average}");
        // Memoryless shape: P(X > mean) = 1/e.
        let above = draws.iter().filter(|&&d| d > mean as f64).count() as f64 / n as f64;
        assert!((above - (-1f64).exp()).abs() < 0.005, "{above}");
        assert!(draws.iter().all(|&d| d >= 1.0));
    }

    #[test]
    fn weights_are_the_inverse_probability() {
        let mean = 1000;
        // Tiny: about one mean each; huge: about its own size, one object.
        let (bytes, objects) = weights(1, mean);
        assert!((bytes - 1000.5).abs() < 0.01 && (objects - 1000.5).abs() < 0.01);
        let (bytes, objects) = weights(1_000_000, mean);
        assert_eq!((bytes, objects), (1_000_000.0, 1.0));
        assert_eq!(weights(0, mean), (0.0, 0.0));
        // A mean of 0 is taken as 1 (every byte sampled): weights of one.
        assert_eq!(weights(8, 0).1, 1.0 / (1.0 - (-8f64).exp()));
    }

    /// The whole scheme, simulated: the countdown over a stream of mixed sizes, each
    /// sample weighted, estimates the stream's bytes and objects of every size class.
    #[test]
    fn estimates_are_unbiased_for_tiny_and_huge_allocations() {
        // A small mean, so that even the 16-byte class is sampled often in a short run.
        let mean = 1024;
        let sizes = [16u64, 200, 4096, 70_000, 3_000_000];
        let mut rng = Rng::new(42);
        let mut left = next_countdown(&mut rng, mean);
        let (mut est_bytes, mut est_objects) = ([0f64; 5], [0f64; 5]);
        let (mut true_bytes, mut true_objects) = ([0f64; 5], [0f64; 5]);
        let mut pick = Rng::new(3);
        for _ in 0..4_000_000 {
            let class = (pick.next_u64() % 5) as usize;
            // The huge class is rarer, as in a real service.
            if class == 4 && !pick.next_u64().is_multiple_of(50) {
                continue;
            }
            let size = sizes[class];
            true_bytes[class] += size as f64;
            true_objects[class] += 1.0;
            left -= size as i64;
            if left <= 0 {
                let (b, o) = weights(size, mean);
                est_bytes[class] += b;
                est_objects[class] += o;
                left = next_countdown(&mut rng, mean);
            }
        }
        for class in 0..5 {
            let bytes = est_bytes[class] / true_bytes[class] - 1.0;
            let objects = est_objects[class] / true_objects[class] - 1.0;
            // About 800,000 allocations a class: 12,500 samples of the 16-byte class (a
            // standard error under 1 %), nearly every one of the large ones: within 4 %.
            assert!(bytes.abs() < 0.04, "class {class}: bytes off by {bytes}");
            assert!(
                objects.abs() < 0.04,
                "class {class}: objects off by {objects}"
            );
        }
    }
}
