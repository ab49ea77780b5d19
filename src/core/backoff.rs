//! Retry delays. Every strategy is a value that computes the delay before retry `n`
//! (n = 1 for the first retry) without sleeping, from a random source passed in.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, RngCore};

use super::error::JobError;

/// A user-supplied delay function of (retry number, error).
pub type DelayFn = Arc<dyn Fn(u32, &JobError) -> Duration + Send + Sync>;

/// How long to wait before retry `n`.
#[derive(Clone)]
pub enum Backoff {
    /// The seed's formula: `min(base · multiplier^(n-1), max) + jitter`, with jitter uniform in
    /// `[0, min(jitter_max, max - capped))` so `max` is a true cap.
    Exponential {
        /// Delay before the first retry.
        base: Duration,
        /// Growth per retry (≥ 1).
        multiplier: f64,
        /// No delay exceeds this.
        max: Duration,
        /// Upper bound of the added jitter.
        jitter_max: Duration,
    },
    /// "Full jitter": uniform in `[0, min(base · multiplier^(n-1), max)]`.
    FullJitter {
        /// Scale of the first retry.
        base: Duration,
        /// Growth per retry (≥ 1).
        multiplier: f64,
        /// No delay exceeds this.
        max: Duration,
    },
    /// "Decorrelated jitter": `d(n) = min(max, uniform[base, 3 · d(n-1)])`, `d(0) = base`.
    /// Computed by walking the chain, so it needs no stored previous delay.
    Decorrelated {
        /// Smallest delay.
        base: Duration,
        /// No delay exceeds this.
        max: Duration,
    },
    /// Sidekiq's default as its older documentation (the wiki) gives it:
    /// `count^4 + 15 + rand(10) · (count + 1)` seconds, `count = n - 1`: the jitter is one of
    /// ten multiples of `count + 1`. Kept as it was; [`Backoff::Sidekiq8`] is what Sidekiq runs
    /// today.
    Sidekiq,
    /// Sidekiq 8's default (`lib/sidekiq/job_retry.rb`): `count^4 + 15 + rand(10 · (count + 1))`
    /// seconds, `count = n - 1`: the jitter is any whole second below `10 · (count + 1)`.
    Sidekiq8,
    /// A function of the retry number and the error.
    Custom(DelayFn),
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exponential {
                base,
                multiplier,
                max,
                jitter_max,
            } => f
                .debug_struct("Exponential")
                .field("base", base)
                .field("multiplier", multiplier)
                .field("max", max)
                .field("jitter_max", jitter_max)
                .finish(),
            Self::FullJitter {
                base,
                multiplier,
                max,
            } => f
                .debug_struct("FullJitter")
                .field("base", base)
                .field("multiplier", multiplier)
                .field("max", max)
                .finish(),
            Self::Decorrelated { base, max } => f
                .debug_struct("Decorrelated")
                .field("base", base)
                .field("max", max)
                .finish(),
            Self::Sidekiq => f.write_str("Sidekiq"),
            Self::Sidekiq8 => f.write_str("Sidekiq8"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Default for Backoff {
    /// The seed's defaults: 3 s, ×2, at most 1 h, jitter up to 1 s.
    fn default() -> Self {
        Self::Exponential {
            base: Duration::from_secs(3),
            multiplier: 2.0,
            max: Duration::from_secs(3600),
            jitter_max: Duration::from_secs(1),
        }
    }
}

/// `base · multiplier^(n-1)` capped at `max`, in milliseconds, safe for every `n`.
fn capped_exponential_ms(base: Duration, multiplier: f64, max: Duration, n: u32) -> u64 {
    let base_ms = base.as_millis() as f64;
    let max_ms = max.as_millis().min(u64::MAX as u128) as u64;
    if base_ms == 0.0 {
        return 0;
    }
    let exp = f64::from(n.max(1) - 1);
    let raw = base_ms * multiplier.powf(exp);
    if !raw.is_finite() || raw >= max_ms as f64 {
        max_ms
    } else {
        raw as u64
    }
}

fn uniform_below(rng: &mut dyn RngCore, bound_ms: u64) -> u64 {
    if bound_ms == 0 {
        0
    } else {
        rng.random_range(0..bound_ms)
    }
}

impl Backoff {
    /// The seed's formula with explicit parameters.
    pub fn exponential(base: Duration, multiplier: f64, max: Duration, jitter_max: Duration) -> Self {
        Self::Exponential {
            base,
            multiplier,
            max,
            jitter_max,
        }
    }

    /// The delay before retry `n` (n = 1 for the first retry; n = 0 is read as 1).
    pub fn delay(&self, n: u32, err: &JobError, rng: &mut dyn RngCore) -> Duration {
        let n = n.max(1);
        let ms = match self {
            Self::Exponential {
                base,
                multiplier,
                max,
                jitter_max,
            } => {
                let capped = capped_exponential_ms(*base, *multiplier, *max, n);
                let room = (max.as_millis() as u64).saturating_sub(capped);
                capped + uniform_below(rng, (jitter_max.as_millis() as u64).min(room))
            }
            Self::FullJitter {
                base,
                multiplier,
                max,
            } => {
                let cap = capped_exponential_ms(*base, *multiplier, *max, n);
                uniform_below(rng, cap.saturating_add(1))
            }
            Self::Decorrelated { base, max } => {
                let base_ms = base.as_millis() as u64;
                let max_ms = (max.as_millis() as u64).max(base_ms);
                let mut d = base_ms;
                // Once the chain reaches `max` it stays in [base, max]; 64 steps is far past that
                // for any base ≥ 1 ms, so long chains stay cheap.
                for _ in 0..n.min(64) {
                    let hi = d.saturating_mul(3).max(base_ms + 1);
                    d = rng.random_range(base_ms..hi).min(max_ms);
                }
                d
            }
            Self::Sidekiq => {
                let count = u64::from(n - 1);
                let secs = count
                    .saturating_pow(4)
                    .saturating_add(15)
                    .saturating_add(rng.random_range(0..10u64).saturating_mul(count + 1));
                secs.saturating_mul(1000)
            }
            Self::Sidekiq8 => {
                let count = u64::from(n - 1);
                let jitter = 10u64.saturating_mul(count + 1);
                count
                    .saturating_pow(4)
                    .saturating_add(15)
                    .saturating_add(rng.random_range(0..jitter))
                    .saturating_mul(1000)
            }
            Self::Custom(f) => return f(n, err),
        };
        Duration::from_millis(ms)
    }

    /// The largest delay retry `n` can get (jitter at its top). Used to check a policy against
    /// the queue's retention period.
    pub fn worst_case(&self, n: u32) -> Option<Duration> {
        let n = n.max(1);
        let ms = match self {
            Self::Exponential {
                base,
                multiplier,
                max,
                jitter_max,
            } => {
                let capped = capped_exponential_ms(*base, *multiplier, *max, n);
                let room = (max.as_millis() as u64).saturating_sub(capped);
                capped + (jitter_max.as_millis() as u64).min(room)
            }
            Self::FullJitter {
                base,
                multiplier,
                max,
            } => capped_exponential_ms(*base, *multiplier, *max, n),
            Self::Decorrelated { base, max } => (max.as_millis() as u64).max(base.as_millis() as u64),
            Self::Sidekiq => {
                let count = u64::from(n - 1);
                count
                    .saturating_pow(4)
                    .saturating_add(15)
                    .saturating_add(9 * (count + 1))
                    .saturating_mul(1000)
            }
            Self::Sidekiq8 => {
                let count = u64::from(n - 1);
                count
                    .saturating_pow(4)
                    .saturating_add(15)
                    .saturating_add(10 * (count + 1) - 1)
                    .saturating_mul(1000)
            }
            Self::Custom(_) => return None,
        };
        Some(Duration::from_millis(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn err() -> JobError {
        JobError::transient("x")
    }

    #[test]
    fn seed_default_schedule() {
        // The seed's table: 3 s, 6 s, 12 s, 24 s, 48 s, each plus 0–1 s of jitter.
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(7);
        for (n, secs) in [(1, 3), (2, 6), (3, 12), (4, 24), (5, 48)] {
            for _ in 0..200 {
                let d = b.delay(n, &err(), &mut rng);
                assert!(d >= Duration::from_secs(secs), "retry {n}: {d:?}");
                assert!(d < Duration::from_secs(secs + 1), "retry {n}: {d:?}");
            }
        }
    }

    #[test]
    fn max_is_a_true_cap_with_jitter_clipped() {
        let b = Backoff::exponential(
            Duration::from_secs(3),
            2.0,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        let mut rng = StdRng::seed_from_u64(1);
        for n in [4, 5, 30, u32::MAX] {
            assert_eq!(b.delay(n, &err(), &mut rng), Duration::from_secs(10));
        }
        // Just below the cap, jitter only fills the room left.
        let b = Backoff::exponential(
            Duration::from_millis(9_600),
            1.0,
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        for _ in 0..100 {
            let d = b.delay(1, &err(), &mut rng);
            assert!(
                d >= Duration::from_millis(9_600) && d < Duration::from_secs(10),
                "{d:?}"
            );
        }
    }

    #[test]
    fn sidekiq_formula() {
        let mut rng = StdRng::seed_from_u64(3);
        for n in 1..=25u32 {
            let count = u64::from(n - 1);
            let d = Backoff::Sidekiq.delay(n, &err(), &mut rng).as_secs();
            let lo = count.pow(4) + 15;
            assert!(d >= lo && d <= lo + 9 * (count + 1), "n={n} d={d}");
        }
    }

    #[test]
    fn sidekiq8_draws_every_whole_second_of_its_jitter_range() {
        // Sidekiq 8 (lib/sidekiq/job_retry.rb): `count**4 + 15`, plus `rand(10 * (count + 1))`.
        let mut rng = StdRng::seed_from_u64(5);
        for n in 1..=25u32 {
            let count = u64::from(n - 1);
            let lo = count.pow(4) + 15;
            let top = lo + 10 * (count + 1) - 1;
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..4_000 {
                let d = Backoff::Sidekiq8.delay(n, &err(), &mut rng);
                assert_eq!(d.subsec_nanos(), 0, "whole seconds");
                let d = d.as_secs();
                assert!(d >= lo && d <= top, "n={n} d={d}");
                seen.insert(d);
            }
            // Not only multiples of (count + 1), as the older formula draws.
            assert_eq!(seen.len() as u64, 10 * (count + 1), "n={n}");
            assert_eq!(Backoff::Sidekiq8.worst_case(n), Some(Duration::from_secs(top)));
        }
        // The older formula's jitter is rand(10) * (count + 1): ten values, multiples of it.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            seen.insert(Backoff::Sidekiq.delay(3, &err(), &mut rng).as_secs() - 31);
        }
        assert_eq!(seen, (0..10).map(|j| j * 3).collect());
    }

    #[test]
    fn full_and_decorrelated_jitter_stay_in_range() {
        let mut rng = StdRng::seed_from_u64(11);
        let fj = Backoff::FullJitter {
            base: Duration::from_secs(1),
            multiplier: 2.0,
            max: Duration::from_secs(60),
        };
        let dj = Backoff::Decorrelated {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        for n in 1..40 {
            let f = fj.delay(n, &err(), &mut rng);
            assert!(f <= Duration::from_secs(60).min(Duration::from_secs(1 << (n - 1).min(20))));
            let d = dj.delay(n, &err(), &mut rng);
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(60),
                "{d:?}"
            );
        }
    }

    #[test]
    fn custom_sees_attempt_and_error() {
        let b = Backoff::Custom(Arc::new(|n, e: &JobError| {
            Duration::from_secs(u64::from(n) * if e.message() == "slow" { 10 } else { 1 })
        }));
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(
            b.delay(3, &JobError::transient("slow"), &mut rng),
            Duration::from_secs(30)
        );
        assert_eq!(b.delay(3, &err(), &mut rng), Duration::from_secs(3));
        assert_eq!(b.worst_case(3), None);
    }
}
