//! Small statistics: percentiles, FIFO inversions, Jain's fairness index.

use std::time::Duration;

/// Latency samples, summarised by percentiles.
#[derive(Clone, Debug, Default)]
pub(crate) struct Samples {
    nanos: Vec<u64>,
}

impl Samples {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Samples {
            nanos: Vec::with_capacity(capacity),
        }
    }

    pub(crate) fn push(&mut self, sample: Duration) {
        self.nanos
            .push(u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX));
    }

    #[cfg(test)]
    pub(crate) fn push_nanos(&mut self, nanos: u64) {
        self.nanos.push(nanos);
    }

    pub(crate) fn len(&self) -> usize {
        self.nanos.len()
    }

    /// No samples: every percentile reads zero, which must not pass a latency target.
    pub(crate) fn is_empty(&self) -> bool {
        self.nanos.is_empty()
    }

    /// The `p`-th percentile (0..=100), nearest rank; zero when empty.
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        if self.nanos.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.nanos.clone();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        Duration::from_nanos(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    pub(crate) fn median(&self) -> Duration {
        self.percentile(50.0)
    }

    pub(crate) fn max(&self) -> Duration {
        Duration::from_nanos(self.nanos.iter().copied().max().unwrap_or(0))
    }
}

/// Pairs `(i, j)`, `i < j`, where `order[i] > order[j]`: how far an acquisition order is from
/// the request order `0, 1, 2, ...`.
pub(crate) fn inversions(order: &[usize]) -> usize {
    let mut count = 0;
    for (i, a) in order.iter().enumerate() {
        count += order[i + 1..].iter().filter(|b| a > b).count();
    }
    count
}

/// Kendall's tau between `order` and the sorted order: 1 when identical, -1 when reversed.
pub(crate) fn kendall_tau(order: &[usize]) -> f64 {
    let n = order.len();
    if n < 2 {
        return 1.0;
    }
    let pairs = (n * (n - 1) / 2) as f64;
    1.0 - 2.0 * inversions(order) as f64 / pairs
}

/// Jain's fairness index of per-participant shares: 1 when all equal, 1/n when one takes all.
pub(crate) fn jain_index(shares: &[u64]) -> f64 {
    let sum: f64 = shares.iter().map(|&x| x as f64).sum();
    let squares: f64 = shares.iter().map(|&x| (x as f64) * (x as f64)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (shares.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let mut samples = Samples::default();
        for n in (1..=100).rev() {
            samples.push_nanos(n);
        }
        assert_eq!(samples.median(), Duration::from_nanos(50));
        assert_eq!(samples.percentile(99.0), Duration::from_nanos(99));
        assert_eq!(samples.max(), Duration::from_nanos(100));
        assert_eq!(Samples::default().median(), Duration::ZERO);
    }

    #[test]
    fn inversions_and_tau() {
        assert_eq!(inversions(&[0, 1, 2, 3]), 0);
        assert_eq!(inversions(&[1, 0, 2, 3]), 1);
        assert_eq!(inversions(&[3, 2, 1, 0]), 6);
        assert_eq!(kendall_tau(&[0, 1, 2, 3]), 1.0);
        assert_eq!(kendall_tau(&[3, 2, 1, 0]), -1.0);
    }

    #[test]
    fn jain() {
        assert_eq!(jain_index(&[5, 5, 5, 5]), 1.0);
        assert!((jain_index(&[4, 0, 0, 0]) - 0.25).abs() < 1e-12);
    }
}
