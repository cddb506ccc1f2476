//! Random durations (and other non-negative quantities) described in a scenario.
//!
//! In TOML a distribution is either a bare number (fixed) or a one-key table:
//!
//! ```toml
//! compute = 250                                   # fixed
//! compute = { fixed = 250 }
//! compute = { uniform = [100, 400] }              # inclusive bounds
//! compute = { exponential = 300 }                 # mean
//! compute = { lognormal = { median = 300, sigma = 0.8 } }
//! compute = { empirical = [120, 120, 4000] }      # each sample equally likely
//! ```
//!
//! Values are in the unit the field names (usually nanoseconds at full core speed).

use rand::Rng;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::scenario::Problem;

/// A distribution of non-negative values.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    /// Always this value.
    Fixed(f64),
    /// Uniform between the two bounds (inclusive).
    Uniform([f64; 2]),
    /// Exponential with this mean.
    Exponential(f64),
    /// Log-normal with this median and shape (standard deviation of the log).
    Lognormal {
        /// The median, in the field's unit.
        median: f64,
        /// Standard deviation of the natural log of the value (dimensionless).
        sigma: f64,
    },
    /// One of these samples, each equally likely.
    Empirical(Vec<f64>),
}

/// The table form, externally tagged by the variant name.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum Tagged {
    Fixed(f64),
    Uniform([f64; 2]),
    Exponential(f64),
    Lognormal { median: f64, sigma: f64 },
    Empirical(Vec<f64>),
}

impl<'de> Deserialize<'de> for Distribution {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Distribution, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Distribution;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number or a table like { exponential = 300 }")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Distribution, E> {
                Ok(Distribution::Fixed(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Distribution, E> {
                Ok(Distribution::Fixed(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Distribution, E> {
                Ok(Distribution::Fixed(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Distribution, A::Error> {
                let tagged = Tagged::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(match tagged {
                    Tagged::Fixed(v) => Distribution::Fixed(v),
                    Tagged::Uniform(b) => Distribution::Uniform(b),
                    Tagged::Exponential(m) => Distribution::Exponential(m),
                    Tagged::Lognormal { median, sigma } => Distribution::Lognormal { median, sigma },
                    Tagged::Empirical(s) => Distribution::Empirical(s),
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// The largest value a distribution may hold: a day in nanoseconds (or cycles). Simulated
/// time is counted in picoseconds in a `u64`, which larger values would overflow.
pub const MAX_VALUE: f64 = 86_400e9;

impl Distribution {
    /// Why this distribution cannot be used, if it cannot: negative or non-finite values,
    /// reversed bounds, no samples.
    pub fn problem(&self) -> Option<Problem> {
        let values: Vec<f64> = match self {
            Distribution::Fixed(v) | Distribution::Exponential(v) => vec![*v],
            Distribution::Uniform([a, b]) => vec![*a, *b],
            Distribution::Lognormal { median, sigma } => vec![*median, *sigma],
            Distribution::Empirical(s) => s.clone(),
        };
        if let Some(v) = values.iter().find(|v| **v < 0.0) {
            return Some(Problem::Negative(v.to_string()));
        }
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Some(Problem::Invalid(format!("must be a finite number, got {v:?}")));
        }
        if let Some(v) = values.iter().find(|v| **v > MAX_VALUE) {
            return Some(Problem::Invalid(format!("{v} is too large (at most {MAX_VALUE:e}: a day in ns)")));
        }
        match self {
            Distribution::Uniform([a, b]) if a > b => {
                Some(Problem::Invalid(format!("uniform bounds must be [low, high], got [{a}, {b}]")))
            }
            Distribution::Empirical(s) if s.is_empty() => {
                Some(Problem::Invalid("empirical needs at least one sample".into()))
            }
            _ => None,
        }
    }

    /// The mean of the distribution.
    pub fn mean(&self) -> f64 {
        match self {
            Distribution::Fixed(v) | Distribution::Exponential(v) => *v,
            Distribution::Uniform([a, b]) => (a + b) / 2.0,
            Distribution::Lognormal { median, sigma } => median * (sigma * sigma / 2.0).exp(),
            Distribution::Empirical(s) => s.iter().sum::<f64>() / s.len() as f64,
        }
    }

    /// Draws one value. Fixed distributions draw no random numbers, so adding one to a
    /// scenario does not shift the random stream of the others.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            Distribution::Fixed(v) => *v,
            Distribution::Uniform([a, b]) => a + (b - a) * rng.gen::<f64>(),
            Distribution::Exponential(mean) => -mean * (1.0 - rng.gen::<f64>()).ln(),
            Distribution::Lognormal { median, sigma } => median * (sigma * standard_normal(rng)).exp(),
            Distribution::Empirical(s) => s[rng.gen_range(0..s.len())],
        }
    }
}

/// A choice among kinds (e.g. a model's call types) by relative weight.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightedChoice {
    /// Running totals of the weights, one per kind.
    cumulative: Vec<f64>,
}

impl WeightedChoice {
    /// Adds the next kind; its weight must be finite and > 0.
    pub fn push(&mut self, weight: f64) -> Result<(), Problem> {
        if !(weight.is_finite() && weight > 0.0) {
            return Err(Problem::Invalid(format!("must be > 0, got {weight:?}")));
        }
        let total = self.cumulative.last().copied().unwrap_or(0.0) + weight;
        self.cumulative.push(total);
        Ok(())
    }

    /// How many kinds there are.
    pub fn len(&self) -> usize {
        self.cumulative.len()
    }

    /// Whether no kind was added.
    pub fn is_empty(&self) -> bool {
        self.cumulative.is_empty()
    }

    /// Draws the index of a kind (one random number), each with probability weight / total.
    /// Panics if no kind was added.
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        let total = *self.cumulative.last().expect("at least one kind");
        let x = rng.gen::<f64>() * total;
        self.cumulative.iter().position(|&w| x < w).unwrap_or(self.cumulative.len() - 1)
    }
}

/// A standard normal deviate (Box–Muller; one of the pair is discarded for simplicity).
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u1 = 1.0 - rng.gen::<f64>(); // (0, 1]: ln is finite
    let u2 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    #[derive(Deserialize)]
    struct Holder {
        d: Distribution,
    }

    fn parse(s: &str) -> Result<Distribution, toml::de::Error> {
        toml::from_str::<Holder>(&format!("d = {s}")).map(|h| h.d)
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(parse("250").unwrap(), Distribution::Fixed(250.0));
        assert_eq!(parse("2.5").unwrap(), Distribution::Fixed(2.5));
        assert_eq!(parse("{ fixed = 3 }").unwrap(), Distribution::Fixed(3.0));
        assert_eq!(parse("{ uniform = [1, 2] }").unwrap(), Distribution::Uniform([1.0, 2.0]));
        assert_eq!(parse("{ exponential = 30 }").unwrap(), Distribution::Exponential(30.0));
        assert_eq!(
            parse("{ lognormal = { median = 5, sigma = 0.5 } }").unwrap(),
            Distribution::Lognormal { median: 5.0, sigma: 0.5 }
        );
        assert_eq!(parse("{ empirical = [1, 9] }").unwrap(), Distribution::Empirical(vec![1.0, 9.0]));
    }

    #[test]
    fn rejects_unknown_forms_and_bad_values() {
        let err = parse("{ gaussian = 3 }").unwrap_err().to_string();
        assert!(err.contains("gaussian"), "{err}");
        assert!(parse("\"fast\"").is_err());
        assert_eq!(parse("-5").unwrap().problem(), Some(Problem::Negative("-5".into())));
        assert!(parse("{ uniform = [5, 1] }").unwrap().problem().is_some());
        assert!(parse("{ empirical = [] }").unwrap().problem().is_some());
        assert!(parse("{ lognormal = { median = 5, sigma = -1 } }").unwrap().problem().is_some());
        assert!(parse("{ exponential = 5 }").unwrap().problem().is_none());
    }

    #[test]
    fn sample_means_are_close_to_the_mean() {
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        for d in [
            Distribution::Uniform([100.0, 300.0]),
            Distribution::Exponential(200.0),
            Distribution::Lognormal { median: 150.0, sigma: 0.6 },
            Distribution::Empirical(vec![100.0, 300.0]),
        ] {
            let n = 40_000;
            let mean = (0..n).map(|_| d.sample(&mut rng)).sum::<f64>() / n as f64;
            assert!((mean - d.mean()).abs() / d.mean() < 0.03, "{d:?}: {mean} vs {}", d.mean());
        }
    }

    #[test]
    fn weighted_choice_follows_the_weights_and_rejects_bad_ones() {
        let mut mix = WeightedChoice::default();
        for w in [1.0, 3.0] {
            mix.push(w).unwrap();
        }
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(mix.push(bad), Err(Problem::Invalid(_))), "{bad}");
        }
        assert_eq!(mix.len(), 2);
        let mut rng = Pcg64Mcg::seed_from_u64(3);
        let second = (0..10_000).filter(|_| mix.draw(&mut rng) == 1).count();
        assert!((7_200..7_800).contains(&second), "{second} of 10000 draws took weight 3 of 4");
    }

    proptest::proptest! {
        #[test]
        fn samples_stay_in_range(seed: u64, a in 0.0f64..1e6, w in 0.0f64..1e6) {
            let mut rng = Pcg64Mcg::seed_from_u64(seed);
            let u = Distribution::Uniform([a, a + w]);
            let x = u.sample(&mut rng);
            proptest::prop_assert!(x >= a && x <= a + w);
            proptest::prop_assert!(Distribution::Exponential(a).sample(&mut rng) >= 0.0);
            let lognormal = Distribution::Lognormal { median: a, sigma: 1.0 };
            proptest::prop_assert!(lognormal.sample(&mut rng) >= 0.0);
        }
    }
}
