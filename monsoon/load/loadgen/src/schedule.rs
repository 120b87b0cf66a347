//! The open-model schedule, computed exactly like `monsoon.load.schedule.Schedule.__iter__`.
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

#[cfg(test)]
mod tests {
    //! Expected values marked "from Python" were computed by `monsoon.load.schedule.Schedule.__iter__`
    //! (the same Fraction arithmetic, fed these segments directly) and pasted here as literals.
    use super::*;

    /// Every message time of the whole schedule, in k order (one shard owning all devices).
    fn all_times(segs: &[[f64; 3]]) -> Vec<f64> {
        let mut s = ShardSchedule::new(plan(segs).unwrap(), 1, 0, 1);
        let mut out = Vec::new();
        while let Some((k, d, t)) = s.next() {
            assert_eq!(k, out.len() as u64, "k must be consecutive");
            assert_eq!(d, 0);
            out.push(t);
        }
        out
    }

    /// FNV-1a over the little-endian bytes of each time (same digest computed in Python).
    fn fnv(ts: &[f64]) -> u64 {
        let mut h: u64 = 0xcbf29ce484222325;
        for t in ts {
            for b in t.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
        h
    }

    fn bits(ts: &[f64]) -> Vec<u64> {
        ts.iter().map(|t| t.to_bits()).collect()
    }

    fn q(x: f64) -> BigRational {
        BigRational::from_float(x).unwrap()
    }

    /// `f` is the f64 nearest to `x` (ties to even), like Python's `float(Fraction)`: checked
    /// against both neighbours with exact rationals, independently of `BigRational::to_f64`.
    fn assert_correctly_rounded(x: &BigRational, f: f64) {
        assert!(f >= 0.0);
        let err = |g: f64| {
            let d = x - q(g);
            if d < BigRational::zero() { -d } else { d }
        };
        let e = err(f);
        let up = f64::from_bits(f.to_bits() + 1);
        let down = prev_float(f);
        for n in [up, down] {
            let en = err(n);
            assert!(e <= en, "{f} is not the nearest f64 to {x} ({n} is nearer)");
            if e == en {
                assert_eq!(f.to_bits() & 1, 0, "tie must go to the even mantissa");
            }
        }
    }

    /// Tiny deterministic PRNG (xorshift64*), so property tests need no extra crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545F4914F6CDD1D)
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Contiguous random segments: awkward float boundaries and rates, some zero rates,
    /// some empty segments, some whole-number areas.
    fn random_segments(rng: &mut Rng, n: usize) -> Vec<[f64; 3]> {
        let mut t = rng.unit() * 0.5;
        let mut out = Vec::new();
        for _ in 0..n {
            let d = match rng.below(5) {
                0 => 0.0,
                1 => 0.1,
                2 => rng.unit() * 0.01,
                _ => rng.unit() * 2.0,
            };
            let r = match rng.below(6) {
                0 => 0.0,
                1 => 1000.0 / 3.0,
                2 => rng.unit(),
                3 => 10.0,
                _ => rng.unit() * 3000.0,
            };
            out.push([t, t + d, r]);
            t += d;
        }
        out
    }

    // 40 contiguous random segments (Python's random.Random(20240601)) and their plan
    const RANDOM_SEGMENTS: [[f64; 3]; 40] = [
        [0.0, 0.1, 2920.557034009604],
        [0.1, 2.967510015544281, 344.12204382206454],
        [2.967510015544281, 2.9708751167662717, 0.1],
        [2.9708751167662717, 2.9708751167662717, 0.8770399216833824],
        [2.9708751167662717, 2.9708751167662717, 333.3333333333333],
        [2.9708751167662717, 3.070875116766272, 333.3333333333333],
        [3.070875116766272, 3.170875116766272, 333.3333333333333],
        [3.170875116766272, 3.1715234380675934, 1890.4028313555748],
        [3.1715234380675934, 4.171523438067593, 1113.1991149627904],
        [4.171523438067593, 4.171523438067593, 1721.5437784956111],
        [4.171523438067593, 4.271523438067593, 333.3333333333333],
        [4.271523438067593, 4.278852109682663, 925.4605094816343],
        [4.278852109682663, 4.278852109682663, 0.6247957372904093],
        [4.278852109682663, 4.286836162347362, 0.39841749721270614],
        [4.286836162347362, 5.682025305359854, 0.0],
        [5.682025305359854, 5.682025305359854, 333.3333333333333],
        [5.682025305359854, 5.782025305359854, 333.3333333333333],
        [5.782025305359854, 8.652927948357332, 7.3],
        [8.652927948357332, 8.652927948357332, 636.0636553835898],
        [8.652927948357332, 8.655223519527908, 0.1],
        [8.655223519527908, 8.655223519527908, 2297.4654708938942],
        [8.655223519527908, 8.664911476532671, 0.0],
        [8.664911476532671, 8.66711748169578, 0.11373268950927673],
        [8.66711748169578, 8.767117481695779, 0.3696834142663833],
        [8.767117481695779, 8.776909170986103, 1232.3252322170463],
        [8.776909170986103, 8.876909170986103, 7.3],
        [8.876909170986103, 8.976909170986103, 0.3584135247822684],
        [8.976909170986103, 9.976909170986103, 617.3403864734909],
        [9.976909170986103, 9.976909170986103, 7.3],
        [9.976909170986103, 9.976909170986103, 219.66396129110274],
        [9.976909170986103, 10.976909170986103, 3630.59776496707],
        [10.976909170986103, 10.982140413665608, 0.7433143783542818],
        [10.982140413665608, 11.082140413665607, 0.608353061520612],
        [11.082140413665607, 11.182140413665607, 1924.4915386464256],
        [11.182140413665607, 12.182140413665607, 0.0],
        [12.182140413665607, 12.282140413665607, 17.458243134067825],
        [12.282140413665607, 13.282140413665607, 333.3333333333333],
        [13.282140413665607, 13.624373303639358, 7.3],
        [13.624373303639358, 13.624373303639358, 4969.0824371562385],
        [13.624373303639358, 14.624373303639358, 0.1],
    ];
    // (k0, n, frac0 bits, first time bits, last time bits), from Python
    const RANDOM_PLAN: [(u64, u64, u64, u64, u64); 37] = [
        (0, 293, 0x0000000000000000, 0x0000000000000000, 0x3fb998599c40a4e8),
        (293, 986, 0x3fee37ad80532aa1, 0x3fba4d6f88c15008, 0x4007b886b28c82ba),
        (1279, 0, 0x3fc5dfb3ef0d19b9, 0x0000000000000000, 0x0000000000000000),
        (1279, 0, 0x3fc5d4ad1510fd47, 0x0000000000000000, 0x0000000000000000),
        (1279, 0, 0x3fc5d4ad1510fd47, 0x0000000000000000, 0x0000000000000000),
        (1279, 34, 0x3fc5d4ad1510fd47, 0x4007c5666dfefd5f, 0x40089026f1116bf7),
        (1313, 33, 0x3feaca809a9993ae, 0x4008964bce408696, 0x40095ae77423da8e),
        (1346, 1, 0x3fe01fd5efeee809, 0x40095e7f85a18f7d, 0x40095e7f85a18f7d),
        (1347, 1113, 0x3fd1cfa172631b6f, 0x40095fcac0588ce7, 0x4010aecaffe60ecb),
        (2460, 0, 0x3fb445530c382dbc, 0x0000000000000000, 0x0000000000000000),
        (2460, 34, 0x3fb445530c382dbc, 0x4010afe21caec306, 0x401115425e37fa52),
        (2494, 7, 0x3fe7ddffb6dc5f49, 0x401116dd8205fd92, 0x40111d810e2834ce),
        (2501, 0, 0x3feed49c074bd041, 0x0000000000000000, 0x0000000000000000),
        (2501, 0, 0x3feed49c074bd041, 0x0000000000000000, 0x0000000000000000),
        (2501, 0, 0x3feeba8d044a7144, 0x0000000000000000, 0x0000000000000000),
        (2501, 33, 0x3feeba8d044a7144, 0x4016bd5807d0c8ab, 0x40171fa5dac272a7),
        (2534, 21, 0x3fe40fe2599fcad6, 0x401778bcb4e045d8, 0x4021371bb91f7a98),
        (2555, 0, 0x3fe56b500c18b701, 0x0000000000000000, 0x0000000000000000),
        (2555, 0, 0x3fe56b500c18b701, 0x0000000000000000, 0x0000000000000000),
        (2555, 0, 0x3fe5696ea18ec8cf, 0x0000000000000000, 0x0000000000000000),
        (2555, 0, 0x3fe5696ea18ec8cf, 0x0000000000000000, 0x0000000000000000),
        (2555, 0, 0x3fe5676077624276, 0x0000000000000000, 0x0000000000000000),
        (2555, 12, 0x3fe438883c34fca4, 0x40218906d51f4b65, 0x40218d98cf327d2d),
        (2567, 1, 0x3fe217639f6a8434, 0x4021b56e075e20ca, 0x4021b56e075e20ca),
        (2568, 0, 0x3feabb3aa9a7f4f0, 0x0000000000000000, 0x0000000000000000),
        (2568, 617, 0x3fe9959de6105407, 0x4021f4d7307cfbe6, 0x4023f3ba9a2e15ea),
        (3185, 0, 0x3fdd62577337700d, 0x0000000000000000, 0x0000000000000000),
        (3185, 0, 0x3fdd62577337700d, 0x0000000000000000, 0x0000000000000000),
        (3185, 3631, 0x3fdd62577337700d, 0x4023f43e03a8b931, 0x4025f4286f0aa4dc),
        (6816, 0, 0x3feb9047ba936807, 0x0000000000000000, 0x0000000000000000),
        (6816, 0, 0x3feb706d0aa2f6d2, 0x0000000000000000, 0x0000000000000000),
        (6816, 192, 0x3fe97e10285746b2, 0x40262a4490b327c7, 0x40265d1511353957),
        (7008, 2, 0x3fd63d3076cdfbe7, 0x4028677255854aec, 0x402884c613b078f1),
        (7010, 333, 0x3fe340cd48126448, 0x402891614a713b18, 0x402a8f5500b6dce3),
        (7343, 3, 0x3fd12c453acf7491, 0x402aa34689f5c9f5, 0x402b2f8cad0752b9),
        (7346, 0, 0x3fe8a40f91fb6336, 0x0000000000000000, 0x0000000000000000),
        (7346, 0, 0x3fe8a40f91fb6336, 0x0000000000000000, 0x0000000000000000),
    ];

    #[test]
    fn tiny_schedule_has_exact_python_times() {
        // 3 msg/s for 1 s: k/3 for k = 0, 1, 2 (1.0 itself is excluded)
        let ts = all_times(&[[0.0, 1.0, 3.0]]);
        assert_eq!(bits(&ts), bits(&[0.0, 0.3333333333333333, 0.6666666666666666]));
        assert_eq!(fnv(&ts), 0xa25d20ec5a835f95); // from Python
    }

    #[test]
    fn fraction_left_at_a_segment_end_carries_into_the_next() {
        // 3 msg/s for 0.5 s = 1.5 messages: k=0,1 in the first segment; message 2 lies half a
        // message (0.5 / 2 msg/s = 0.25 s) into the second segment, message 3 one message later.
        let segs = [[0.0, 0.5, 3.0], [0.5, 1.5, 2.0]];
        let p = plan(&segs).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].k0, p[0].n, p[0].frac0), (0, 2, 0.0));
        assert_eq!((p[1].k0, p[1].n, p[1].frac0), (2, 2, 0.5));
        let ts = all_times(&segs);
        assert_eq!(bits(&ts), bits(&[0.0, 0.3333333333333333, 0.75, 1.25]));
        assert_eq!(fnv(&ts), 0x85c216d6ddff672b); // from Python
    }

    #[test]
    fn zero_rate_segments_are_skipped_and_do_not_move_the_carry() {
        let segs = [[0.0, 1.0, 2.5], [1.0, 2.0, 0.0], [2.0, 3.0, 1.5]];
        let p = plan(&segs).unwrap();
        assert_eq!(p.len(), 2, "the zero-rate segment has no plan");
        assert_eq!((p[1].a, p[1].b, p[1].r), (2.0, 3.0, 1.5));
        assert_eq!((p[1].k0, p[1].n, p[1].frac0), (3, 1, 0.5));
        let ts = all_times(&segs);
        assert_eq!(bits(&ts), bits(&[0.0, 0.4, 0.8, 2.3333333333333335])); // from Python
        assert_eq!(fnv(&ts), 0xf79ae8d3dabe824e);
        // a negative zero rate is not "r < 0": accepted and skipped like 0.0
        let p = plan(&[[0.0, 1.0, -0.0], [1.0, 2.0, 1.0]]).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].a, p[0].k0, p[0].n), (1.0, 0, 1));
        // all-zero and empty schedules have no message at all
        assert!(plan(&[[0.0, 5.0, 0.0]]).unwrap().is_empty());
        assert!(plan(&[]).unwrap().is_empty());
        assert!(all_times(&[[0.0, 5.0, 0.0], [5.0, 6.0, 0.0]]).is_empty());
    }

    #[test]
    fn whole_area_excludes_the_end_instant() {
        // R*D whole: exactly R*D messages, the next segment starts on a message (frac0 = 0)
        let segs = [[0.0, 1.0, 4.0], [1.0, 2.0, 4.0]];
        let p = plan(&segs).unwrap();
        assert_eq!((p[0].n, p[1].k0, p[1].n, p[1].frac0), (4, 4, 4, 0.0));
        let ts = all_times(&segs);
        assert_eq!(ts, vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]);
        // a positive rate over an empty segment owes nothing
        let p = plan(&[[0.0, 0.5, 3.0], [0.5, 0.5, 1e9], [0.5, 1.0, 3.0]]).unwrap();
        assert_eq!(p.iter().map(|p| (p.k0, p.n)).collect::<Vec<_>>(), vec![(0, 2), (2, 0), (2, 1)]);
        assert_eq!(p[1].frac0, 0.5);
    }

    #[test]
    fn awkward_floats_match_python_bit_for_bit() {
        // 0.1 and 0.30000000000000004 are not what they look like; the rationals are exact
        let segs = [
            [0.0, 0.1, 7.3],
            [0.1, 0.30000000000000004, 1000.0 / 3.0],
            [0.30000000000000004, 1.7, 0.0],
            [1.7, 2.9, 11.1],
        ];
        let p = plan(&segs).unwrap();
        let got: Vec<(u64, u64, f64)> = p.iter().map(|p| (p.k0, p.n, p.frac0)).collect();
        // from Python
        assert_eq!(got, vec![(0, 1, 0.0), (1, 67, 0.26999999999999996), (68, 13, 0.6033333333333242)]);
        let ts = all_times(&segs);
        assert_eq!(ts.len(), 81);
        assert_eq!(
            bits(&ts[..6]),
            bits(&[0.0, 0.10081000000000001, 0.10381, 0.10681, 0.10981, 0.11281000000000001])
        );
        assert_eq!(bits(&ts[67..70]), bits(&[0.29881, 1.7543543543543534, 1.8444444444444437]));
        assert_eq!(*ts.last().unwrap(), 2.8354354354354347);
        assert_eq!(fnv(&ts), 0xa5b0fd155cb05855); // all 81 times, from Python
    }

    #[test]
    fn rounding_onto_the_segment_end_is_pulled_back_inside() {
        // 0.1 + 1/3 rounds to exactly b: Python yields nextafter(b, -inf), so must we
        let b = 0.43333333333333335;
        assert_eq!(0.1 + 1.0 / 3.0, b);
        let ts = all_times(&[[0.1, b, 3.0]]);
        assert_eq!(bits(&ts), bits(&[0.1, 0.4333333333333333])); // from Python
        assert!(ts[1] < b);
        // 0.7 + 3/0.1 = 30.700000000000003 > 30.7
        let ts = all_times(&[[0.7, 30.7, 0.1]]);
        assert_eq!(bits(&ts), bits(&[0.7, 10.7, 20.7, 30.699999999999996])); // from Python
        assert_eq!(ts[3].to_bits(), 30.7f64.to_bits() - 1);
    }

    #[test]
    fn prev_float_is_one_ulp_towards_minus_infinity() {
        assert_eq!(prev_float(1.0), 0.9999999999999999);
        assert_eq!(prev_float(0.0), -5e-324);
        assert_eq!(prev_float(-0.0), -5e-324);
        assert_eq!(prev_float(-1.0), -1.0000000000000002);
        assert_eq!(prev_float(f64::MIN_POSITIVE).to_bits(), f64::MIN_POSITIVE.to_bits() - 1);
        assert_eq!(prev_float(5e-324), 0.0);
    }

    #[test]
    fn bad_segments_are_rejected() {
        let bad: [[f64; 3]; 9] = [
            [f64::NAN, 1.0, 1.0],
            [0.0, f64::NAN, 1.0],
            [0.0, 1.0, f64::NAN],
            [0.0, f64::INFINITY, 1.0],
            [f64::NEG_INFINITY, 1.0, 1.0],
            [0.0, 1.0, f64::INFINITY],
            [1.0, 0.5, 1.0],  // b < a
            [0.0, 1.0, -1.0], // r < 0
            [0.0, 1.0, -1e-300],
        ];
        for s in bad {
            let e = plan(&[s]).expect_err(&format!("{s:?} must be rejected"));
            assert!(e.starts_with("bad segment ["), "{e}");
            // also when it comes after good segments, and even with a zero rate
            assert!(plan(&[[0.0, 1.0, 5.0], s]).is_err(), "{s:?} after a good segment");
        }
        assert!(plan(&[[2.0, 1.0, 0.0]]).is_err(), "b < a is bad even at rate 0");
        assert!(plan(&[[0.0, 1.0, 5.0], [1.0, 2.0, 0.0], [3.0, 2.0, 0.0]]).is_err());
        assert_eq!(plan(&[[1.0, 0.5, 1.0]]).unwrap_err(), "bad segment [1, 0.5, 1]");
    }

    #[test]
    fn a_schedule_past_u64_messages_is_an_error_not_a_wrap() {
        let e = plan(&[[0.0, 1e10, 1e300]]).unwrap_err();
        assert_eq!(e, "schedule too long");
        // just past u64::MAX messages in one segment
        assert_eq!(plan(&[[0.0, 1.0, 1.9e19]]).unwrap_err(), "schedule too long");
        assert_eq!(plan(&[[0.0, 1.0, 1.8e19]]).unwrap()[0].n, 18_000_000_000_000_000_000);
    }

    #[test]
    fn random_schedule_matches_python_plan_and_times() {
        let p = plan(&RANDOM_SEGMENTS).unwrap();
        assert_eq!(p.len(), RANDOM_PLAN.len());
        let ts = all_times(&RANDOM_SEGMENTS);
        for (i, (sp, &(k0, n, frac0, first, last))) in p.iter().zip(RANDOM_PLAN.iter()).enumerate() {
            assert_eq!((sp.k0, sp.n), (k0, n), "segment {i}");
            assert_eq!(sp.frac0.to_bits(), frac0, "segment {i}: frac0 {} is not Python's", sp.frac0);
            if n > 0 {
                assert_eq!(ts[k0 as usize].to_bits(), first, "segment {i} first time");
                assert_eq!(ts[(k0 + n - 1) as usize].to_bits(), last, "segment {i} last time");
                assert_eq!(sp.time(0).to_bits(), first);
                assert_eq!(sp.time(n - 1).to_bits(), last);
            }
        }
        assert_eq!(ts.len(), 7346); // from Python
        assert_eq!(fnv(&ts), 0xf57fbf4e3c0fdc2d); // every time, from Python
        assert_eq!(ts[1], 0.0003424004353810238);
        assert_eq!(*ts.last().unwrap(), 13.592870146888673);
    }

    #[test]
    fn tens_of_thousands_of_messages_match_python() {
        let segs = [[0.0, 0.5, 50000.0], [0.5, 1.25, 49999.9], [1.25, 1.25, 3.0], [1.25, 2.0, 12345.678]];
        let ts = all_times(&segs);
        // 25000 + 37499.925 + 0 + 9259.2585 = 71759.1835 -> 71760 messages
        assert_eq!(ts.len(), 71760);
        assert_eq!(fnv(&ts), 0x8daa3dc87184877a); // from Python
        assert_eq!(*ts.last().unwrap(), 1.999985136498781);
    }

    #[test]
    fn counts_are_the_ceiling_of_the_exact_area() {
        let mut rng = Rng(0x9E3779B97F4A7C15);
        for round in 0..60 {
            let n = 1 + rng.below(12) as usize;
            let segs = random_segments(&mut rng, n);
            let p = plan(&segs).unwrap();
            // independently: area before/after each positive segment, as exact rationals
            let mut area = BigRational::zero();
            let mut k = 0u64;
            let mut pi = p.iter();
            for s in &segs {
                let end = &area + q(s[2]) * (q(s[1]) - q(s[0]));
                if s[2] > 0.0 {
                    let sp = pi.next().expect("one plan per positive-rate segment");
                    assert_eq!((sp.a, sp.b, sp.r), (s[0], s[1], s[2]));
                    assert_eq!(sp.k0, k, "round {round}: k0 continues the previous segment");
                    assert_eq!(BigInt::from(sp.k0), ceil(&area));
                    assert_eq!(BigInt::from(sp.k0 + sp.n), ceil(&end), "round {round}: {segs:?}");
                    // frac0 = k0 - area, rounded once
                    let exact = BigRational::from_integer(BigInt::from(sp.k0)) - &area;
                    assert!(sp.frac0 >= 0.0 && sp.frac0 <= 1.0);
                    assert_correctly_rounded(&exact, sp.frac0);
                    k += sp.n;
                } else {
                    assert_eq!(end, area);
                }
                area = end;
            }
            assert!(pi.next().is_none());
            assert_eq!(BigInt::from(k), ceil(&area), "round {round}: total = ceil(total area)");
            assert_eq!(all_times(&segs).len() as u64, k);
        }
    }

    #[test]
    fn times_are_ordered_inside_their_segment_and_where_the_area_says() {
        let mut rng = Rng(42);
        for round in 0..40 {
            let n = 1 + rng.below(8) as usize;
            let segs = random_segments(&mut rng, n);
            let p = plan(&segs).unwrap();
            let mut prev = f64::NEG_INFINITY;
            let mut area = 0.0f64; // approximate area at the start of the segment
            let mut k = 0u64;
            for sp in &p {
                for j in 0..sp.n {
                    let t = sp.time(j);
                    assert!(sp.a <= t && t < sp.b, "round {round}: t={t} outside [{}, {})", sp.a, sp.b);
                    assert!(t >= prev, "round {round}: times go back: {prev} then {t}");
                    // the rate integrated from 0 to t is k (within rounding)
                    let at = area + (t - sp.a) * sp.r;
                    assert!((at - k as f64).abs() < 1e-6 * (1.0 + k as f64), "round {round}: k={k} at area {at}");
                    prev = t;
                    k += 1;
                }
                area += (sp.b - sp.a) * sp.r;
            }
        }
    }

    #[test]
    fn shards_partition_the_messages_by_device() {
        let segs = [[0.0, 0.5, 3.0], [0.5, 1.5, 2.0], [1.5, 2.0, 0.0], [2.0, 4.0, 37.3]];
        let full: Vec<f64> = all_times(&segs);
        assert_eq!(full.len(), 4 + 75);
        for d in [1u64, 2, 5, 7, 10, 100] {
            for n in 1..=4u64.min(d) {
                let mut seen = vec![false; full.len()];
                for i in 0..n {
                    // gen::shard_range's split: devices [i*D/n, (i+1)*D/n)
                    let (lo, hi) = (i * d / n, (i + 1) * d / n);
                    let mut s = ShardSchedule::new(plan(&segs).unwrap(), d, lo, hi);
                    let mut last_k = None;
                    while let Some((k, dev, t)) = s.next() {
                        assert_eq!(dev, k % d);
                        assert!(lo <= dev && dev < hi, "d={d} shard {i}/{n}: device {dev}");
                        assert!(last_k.map_or(true, |l| k > l), "k increases within a shard");
                        assert_eq!(t.to_bits(), full[k as usize].to_bits(), "same time as unsharded");
                        assert!(!seen[k as usize], "message {k} in two shards");
                        seen[k as usize] = true;
                        last_k = Some(k);
                    }
                    assert!(s.next().is_none(), "stays exhausted");
                }
                assert!(seen.iter().all(|&x| x), "d={d} n={n}: every message in some shard");
            }
        }
    }

    #[test]
    fn a_shard_walks_only_its_devices() {
        // 10 msg/s for 1 s over 4 devices; the shard owns devices 1 and 2
        let mut s = ShardSchedule::new(plan(&[[0.0, 1.0, 10.0]]).unwrap(), 4, 1, 3);
        let mut got = Vec::new();
        while let Some((k, d, t)) = s.next() {
            got.push((k, d, t));
        }
        assert_eq!(got, vec![(1, 1, 0.1), (2, 2, 0.2), (5, 1, 0.5), (6, 2, 0.6), (9, 1, 0.9)]);
        // the last device only, across a segment boundary with a carry
        let mut s = ShardSchedule::new(plan(&[[0.0, 0.5, 3.0], [0.5, 1.5, 2.0]]).unwrap(), 3, 2, 3);
        assert_eq!(s.next(), Some((2, 2, 0.75)));
        assert_eq!(s.next(), None);
        // more devices than messages: most shards get nothing
        let mut s = ShardSchedule::new(plan(&[[0.0, 1.0, 3.0]]).unwrap(), 1000, 500, 1000);
        assert_eq!(s.next(), None);
    }

    #[test]
    fn an_empty_shard_yields_nothing_even_with_zero_devices() {
        let mut s = ShardSchedule::new(plan(&[[0.0, 1.0, 10.0]]).unwrap(), 4, 2, 2);
        assert_eq!(s.next(), None);
        let mut s = ShardSchedule::new(plan(&[[0.0, 1.0, 10.0]]).unwrap(), 0, 0, 0); // no % by zero
        assert_eq!(s.next(), None);
        let mut s = ShardSchedule::new(Vec::new(), 3, 0, 3);
        assert_eq!(s.next(), None);
        assert_eq!(s.end(), 0.0);
        assert_eq!(s.rate_at(0.0), 0.0);
    }

    #[test]
    fn rate_at_is_the_shards_share_and_end_is_the_last_sending_segment() {
        let segs = [[0.0, 2.0, 100.0], [2.0, 3.0, 0.0], [3.0, 4.5, 2500.0], [4.5, 6.0, 0.0]];
        let s = ShardSchedule::new(plan(&segs).unwrap(), 4, 1, 4); // 3 of 4 devices
        assert_eq!(s.rate_at(0.0), 75.0);
        assert_eq!(s.rate_at(1.999), 75.0);
        assert_eq!(s.rate_at(2.0), 0.0); // [a, b): 2.0 is in the pause
        assert_eq!(s.rate_at(3.0), 1875.0);
        assert_eq!(s.rate_at(4.5), 0.0);
        assert_eq!(s.rate_at(-1.0), 0.0);
        assert_eq!(s.rate_at(100.0), 0.0);
        // zero-rate segments have no plan, so a trailing pause is not part of the end
        assert_eq!(s.end(), 4.5);
    }
}
