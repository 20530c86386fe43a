//! Timing loops and their summaries: warm-up, then up to `iterations` timed runs
//! within a time budget; median and p99 by nearest rank.

use std::time::{Duration, Instant};

use anyhow::Result;

/// Median and p99 of a set of timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub samples: usize,
    pub p50: Duration,
    pub p99: Duration,
}

impl Summary {
    /// Nearest-rank percentiles; `None` for no samples.
    pub fn of(samples: &mut [Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let rank = |p: f64| {
            let index = (p * samples.len() as f64).ceil() as usize;
            samples[index.clamp(1, samples.len()) - 1]
        };
        Some(Summary {
            samples: samples.len(),
            p50: rank(0.50),
            p99: rank(0.99),
        })
    }
}

/// How long to measure one figure.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub warmup: usize,
    pub iterations: usize,
    /// Stop early (after at least `min_iterations`) once this much time was spent.
    pub budget: Duration,
    pub min_iterations: usize,
}

impl Plan {
    pub fn new(warmup: usize, iterations: usize, budget: Duration) -> Plan {
        Plan {
            warmup,
            iterations,
            budget,
            min_iterations: iterations.min(20),
        }
    }
}

/// Run `step(i)` `plan.warmup` times untimed, then time it; `step` may time a part of
/// itself by returning `Some(duration)`, else the whole call is timed.
pub fn measure(
    plan: Plan,
    mut step: impl FnMut(usize) -> Result<Option<Duration>>,
) -> Result<Summary> {
    for i in 0..plan.warmup {
        step(i)?;
    }
    let started = Instant::now();
    let mut samples = Vec::with_capacity(plan.iterations);
    for i in 0..plan.iterations {
        if i >= plan.min_iterations && started.elapsed() > plan.budget {
            break;
        }
        let before = Instant::now();
        let own = step(plan.warmup + i)?;
        samples.push(own.unwrap_or_else(|| before.elapsed()));
    }
    Summary::of(&mut samples).ok_or_else(|| anyhow::anyhow!("no samples were taken"))
}

/// Time several steps round-robin (one of each per round), so that a noisy
/// neighbour slows them alike and their difference stays meaningful.
pub fn measure_interleaved(
    plan: Plan,
    steps: &mut [&mut dyn FnMut() -> Result<()>],
) -> Result<Vec<Summary>> {
    for _ in 0..plan.warmup {
        for step in steps.iter_mut() {
            step()?;
        }
    }
    let started = Instant::now();
    let mut samples = vec![Vec::with_capacity(plan.iterations); steps.len()];
    for i in 0..plan.iterations {
        if i >= plan.min_iterations && started.elapsed() > plan.budget {
            break;
        }
        for (step, samples) in steps.iter_mut().zip(samples.iter_mut()) {
            let before = Instant::now();
            step()?;
            samples.push(before.elapsed());
        }
    }
    samples
        .iter_mut()
        .map(|s| Summary::of(s).ok_or_else(|| anyhow::anyhow!("no samples were taken")))
        .collect()
}

/// `1.23 µs`, `4.56 ms`, `7.89 s`.
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos() as f64;
    if nanos < 1_000.0 {
        format!("{nanos:.0} ns")
    } else if nanos < 1_000_000.0 {
        format!("{:.1} µs", nanos / 1_000.0)
    } else if nanos < 1_000_000_000.0 {
        format!("{:.2} ms", nanos / 1_000_000.0)
    } else {
        format!("{:.2} s", nanos / 1_000_000_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let cases: &[(&[u64], u64, u64)] = &[
            (&[5], 5, 5),
            (&[1, 2], 1, 2),
            (&[3, 1, 2], 2, 3),
            (&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 5, 10),
        ];
        for (input, p50, p99) in cases {
            let mut samples: Vec<Duration> =
                input.iter().map(|n| Duration::from_micros(*n)).collect();
            let summary = Summary::of(&mut samples).expect("samples");
            assert_eq!(summary.p50, Duration::from_micros(*p50), "{input:?}");
            assert_eq!(summary.p99, Duration::from_micros(*p99), "{input:?}");
        }
        let mut hundred: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let summary = Summary::of(&mut hundred).expect("samples");
        assert_eq!(summary.p99, Duration::from_micros(99));
        assert!(Summary::of(&mut []).is_none());
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(format_duration(Duration::from_nanos(950)), "950 ns");
        assert_eq!(format_duration(Duration::from_nanos(7_540)), "7.5 µs");
        assert_eq!(format_duration(Duration::from_micros(1_234)), "1.23 ms");
        assert_eq!(format_duration(Duration::from_millis(2_500)), "2.50 s");
    }
}
