//! The open-model schedule, computed exactly like `monsoon.load.Schedule.__iter__`.
//!
//! Segment boundaries are integrated with exact rationals (every f64 is a binary
//! rational, as Python's `Fraction(float)`), so message k of a segment that starts
//! at `a` with rate `r` lies at `a + (frac0 + j) / r` — the same IEEE operations as
//! Python, hence bit-identical times, never accumulated from "now".
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{ToPrimitive, Zero};

#[derive(Debug, Clone)]
pub struct SegPlan {
    pub a: f64,
    pub b: f64,
    pub r: f64,
    /// global index of the segment's first message
    pub k0: u64,
    /// first message lies `frac0` messages past `a`
    pub frac0: f64,
    /// number of messages in the segment
    pub n: u64,
}

fn ceil(x: &BigRational) -> BigInt {
    x.ceil().to_integer()
}

pub fn plan(segments: &[[f64; 3]]) -> Result<Vec<SegPlan>, String> {
    let mut out = Vec::new();
    let mut area = BigRational::zero();
    for s in segments {
        let (a, b, r) = (s[0], s[1], s[2]);
        if !(a.is_finite() && b.is_finite() && r.is_finite()) || b < a || r < 0.0 {
            return Err(format!("bad segment [{a}, {b}, {r}]"));
        }
        if r <= 0.0 {
            continue;
        }
        let fr = BigRational::from_float(r).unwrap();
        let fa = BigRational::from_float(a).unwrap();
        let fb = BigRational::from_float(b).unwrap();
        let end_area = &area + fr * (fb - fa);
        let k0 = ceil(&area);
        let frac0 = (BigRational::from_integer(k0.clone()) - &area).to_f64().unwrap();
        let n = ceil(&end_area) - &k0;
        out.push(SegPlan {
            a,
            b,
            r,
            k0: k0.to_u64().ok_or("schedule too long")?,
            frac0,
            n: n.to_u64().ok_or("schedule too long")?,
        });
        area = end_area;
    }
    Ok(out)
}

impl SegPlan {
    /// Intended time (s since start) of the segment's j-th message.
    #[inline]
    pub fn time(&self, j: u64) -> f64 {
        let t = self.a + (self.frac0 + j as f64) / self.r;
        if t < self.b {
            t
        } else {
            prev_float(self.b)
        }
    }
}

fn prev_float(x: f64) -> f64 {
    if x > 0.0 {
        f64::from_bits(x.to_bits() - 1)
    } else if x == 0.0 {
        -f64::from_bits(1)
    } else {
        f64::from_bits(x.to_bits() + 1)
    }
}

/// The messages of one shard: global message k goes to device `k % d`; a shard owns
/// devices `[lo, hi)` and walks only their messages (skipping the others in O(1)).
pub struct ShardSchedule {
    plans: Vec<SegPlan>,
    seg: usize,
    k: u64,
    d: u64,
    lo: u64,
    hi: u64,
}

impl ShardSchedule {
    pub fn new(plans: Vec<SegPlan>, d: u64, lo: u64, hi: u64) -> Self {
        let k = plans.first().map(|p| p.k0).unwrap_or(0);
        ShardSchedule { plans, seg: 0, k, d, lo, hi }
    }

    /// Next owned message: (global index k, device index, intended seconds since start).
    pub fn next(&mut self) -> Option<(u64, u64, f64)> {
        if self.lo >= self.hi {
            return None;
        }
        loop {
            let p = self.plans.get(self.seg)?;
            let m = self.k % self.d;
            if m < self.lo {
                self.k += self.lo - m;
            } else if m >= self.hi {
                self.k += self.d - m + self.lo;
            }
            if self.k < p.k0 {
                self.k = p.k0;
                continue;
            }
            if self.k >= p.k0 + p.n {
                self.seg += 1;
                continue;
            }
            let k = self.k;
            self.k += 1;
            return Some((k, k % self.d, p.time(k - p.k0)));
        }
    }

    /// End of the schedule (s since start): a shard with no message left still holds its
    /// connections until then, like the whole fleet does.
    pub fn end(&self) -> f64 {
        self.plans.last().map(|p| p.b).unwrap_or(0.0)
    }

    /// Target rate (msg/s, this shard's share) at time t.
    pub fn rate_at(&self, t: f64) -> f64 {
        let share = (self.hi - self.lo) as f64 / self.d as f64;
        for p in &self.plans {
            if p.a <= t && t < p.b {
                return p.r * share;
            }
        }
        0.0
    }
}
