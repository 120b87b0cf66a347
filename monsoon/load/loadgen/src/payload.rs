//! Payload composition from the spec exported by `monsoon.payloads.Payload.native_spec()`:
//! a list of parts (literal text, per-message variables, pre-rendered value pools indexed
//! by seq and device index exactly as the Python renderers index them).
use serde::Deserialize;

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PartSpec {
    Lit { lit: String },
    Var { var: String },
    Pool { pool: Vec<String>, seq_mul: u64, idx_mul: u64, add: u64 },
}

#[derive(Deserialize, Debug, Clone, Default)]
pub struct PayloadSpec {
    #[serde(default)]
    pub parts: Vec<PartSpec>,
}

#[derive(Clone, Copy)]
enum Var {
    Ts,
    Seq,
    SentMs,
    DeviceJson,
    DeviceRaw,
    Temperature,
    Humidity,
}

enum Part {
    Lit(Vec<u8>),
    Var(Var),
    Pool { pool: Vec<Vec<u8>>, mask: u64, seq_mul: u64, idx_mul: u64, add: u64 },
}

pub struct Composer {
    parts: Vec<Part>,
}

/// The decimal text of the last number formatted, kept for the next: consecutive messages mostly carry the same
/// millisecond timestamps (at 100,000 msg/s a hundred messages share each `ts`, and a batch one `sent_ms`), so
/// their digits are copied rather than computed again.
pub struct LastNum {
    v: i64,
    len: u8,
    buf: [u8; 20],
}

impl Default for LastNum {
    fn default() -> Self {
        LastNum { v: 0, len: 1, buf: [b'0'; 20] }
    }
}

impl LastNum {
    /// `v` in decimal, as `itoa` writes it.
    #[inline]
    pub fn text(&mut self, v: i64) -> &[u8] {
        if v != self.v {
            let mut ib = itoa::Buffer::new();
            let s = ib.format(v).as_bytes();
            self.buf[..s.len()].copy_from_slice(s);
            self.len = s.len() as u8;
            self.v = v;
        }
        &self.buf[..self.len as usize]
    }
}

/// What [`Composer::render_with`] keeps from one message to the next: the last `ts` and `sent_ms` as text.
#[derive(Default)]
pub struct Stamps {
    ts: LastNum,
    sent_ms: LastNum,
}

/// Python's `json.dumps(s)` (ensure_ascii) without the quotes.
pub fn json_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            '\u{8}' => o.push_str("\\b"),
            '\u{c}' => o.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7E => {
                let mut b = [0u16; 2];
                for u in c.encode_utf16(&mut b) {
                    o.push_str(&format!("\\u{:04x}", u));
                }
            }
            c => o.push(c),
        }
    }
    o
}

impl Composer {
    pub fn new(spec: &PayloadSpec) -> Result<Composer, String> {
        let specs: Vec<PartSpec> = if spec.parts.is_empty() {
            // the "minimal" profile
            let l = |s: &str| PartSpec::Lit { lit: s.to_string() };
            let v = |s: &str| PartSpec::Var { var: s.to_string() };
            vec![
                l("{\"ts\":"), v("ts"), l(",\"values\":{\"device\":"), v("device_json"),
                l(",\"seq\":"), v("seq"), l(",\"sent_ms\":"), v("sent_ms"),
                l(",\"temperature\":"), v("temperature"), l(",\"humidity\":"), v("humidity"), l("}}"),
            ]
        } else {
            spec.parts.clone()
        };
        let mut parts = Vec::new();
        for p in specs {
            parts.push(match p {
                PartSpec::Lit { lit } => Part::Lit(lit.into_bytes()),
                PartSpec::Var { var } => Part::Var(match var.as_str() {
                    "ts" => Var::Ts,
                    "seq" => Var::Seq,
                    "sent_ms" => Var::SentMs,
                    "device_json" => Var::DeviceJson,
                    "device" | "device_raw" => Var::DeviceRaw,
                    "temperature" => Var::Temperature,
                    "humidity" => Var::Humidity,
                    other => return Err(format!("unknown payload variable {other:?}")),
                }),
                PartSpec::Pool { pool, seq_mul, idx_mul, add } => {
                    if pool.is_empty() || !pool.len().is_power_of_two() {
                        return Err("payload pool size must be a power of two".into());
                    }
                    Part::Pool {
                        mask: pool.len() as u64 - 1,
                        pool: pool.into_iter().map(|s| s.into_bytes()).collect(),
                        seq_mul,
                        idx_mul,
                        add,
                    }
                }
            });
        }
        Ok(Composer { parts })
    }

    /// Append the payload of device `idx` (its JSON-escaped name without and with quotes).
    pub fn render(&self, out: &mut Vec<u8>, idx: u64, raw: &[u8], seq: u64, ts: i64, sent_ms: i64) {
        self.render_with(out, &mut Stamps::default(), idx, raw, seq, ts, sent_ms)
    }

    /// [`Composer::render`], reusing the digits of the timestamps the previous message of `stamps` had.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn render_with(&self, out: &mut Vec<u8>, stamps: &mut Stamps, idx: u64, raw: &[u8], seq: u64, ts: i64, sent_ms: i64) {
        let mut ib = itoa::Buffer::new();
        for p in &self.parts {
            match p {
                Part::Lit(b) => out.extend_from_slice(b),
                Part::Var(v) => match v {
                    Var::Ts => out.extend_from_slice(stamps.ts.text(ts)),
                    Var::Seq => out.extend_from_slice(ib.format(seq).as_bytes()),
                    Var::SentMs => out.extend_from_slice(stamps.sent_ms.text(sent_ms)),
                    Var::DeviceRaw => out.extend_from_slice(raw),
                    Var::DeviceJson => {
                        out.push(b'"');
                        out.extend_from_slice(raw);
                        out.push(b'"');
                    }
                    Var::Temperature => {
                        // f"{20.0 + (seq % 150) / 10:.1f}"
                        let t = 200 + seq % 150;
                        out.extend_from_slice(ib.format(t / 10).as_bytes());
                        out.push(b'.');
                        out.push(b'0' + (t % 10) as u8);
                    }
                    Var::Humidity => out.extend_from_slice(ib.format(30 + seq % 50).as_bytes()),
                },
                Part::Pool { pool, mask, seq_mul, idx_mul, add } => {
                    let i = (seq.wrapping_mul(*seq_mul)
                        .wrapping_add(idx.wrapping_mul(*idx_mul))
                        .wrapping_add(*add))
                        & mask;
                    out.extend_from_slice(&pool[i as usize]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The `*_SPEC` texts are `Payload(...).native_spec()` and the `*_GOLDEN` payloads are
    //! `Payload(...).render(idx, name, seq, ts, sent_ms)` from monsoon's payloads.py, with its
    //! pool size patched from 1024 to 8 (`_POOL = 8; POOL_MASK = 7`) to keep the literals short:
    //! the parts and the pool indexing are the same code paths as with 1024.
    use super::*;
    use serde_json::Value;

    type Golden = (u64, &'static str, u64, i64, i64, &'static str);

    const MINIMAL_SPEC: &str = r##"{"parts":[{"lit":"{\"ts\":"},{"var":"ts"},{"lit":",\"values\":{\"device\":"},{"var":"device_json"},{"lit":",\"seq\":"},{"var":"seq"},{"lit":",\"sent_ms\":"},{"var":"sent_ms"},{"lit":",\"temperature\":"},{"var":"temperature"},{"lit":",\"humidity\":"},{"var":"humidity"},{"lit":"}}"}]}"##;
    const MINIMAL_GOLDEN: &[(u64, &str, u64, i64, i64, &str)] = &[
        (0, "monsoon-00000", 0, 1700000000000, 1700000000001, r##"{"ts":1700000000000,"values":{"device":"monsoon-00000","seq":0,"sent_ms":1700000000001,"temperature":20.0,"humidity":30}}"##),
        (5, "dev \"ü\" 😀\\", 149, 1700000000123, 1700000000456, r##"{"ts":1700000000123,"values":{"device":"dev \"\u00fc\" \ud83d\ude00\\","seq":149,"sent_ms":1700000000456,"temperature":34.9,"humidity":79}}"##),
        (1234567, "d7", 6148914691236517205, 42, 43, r##"{"ts":42,"values":{"device":"d7","seq":6148914691236517205,"sent_ms":43,"temperature":20.5,"humidity":35}}"##),
        (3, "d3", 1, 11, 21, r##"{"ts":11,"values":{"device":"d3","seq":1,"sent_ms":21,"temperature":20.1,"humidity":31}}"##),
        (3, "d3", 2, 12, 22, r##"{"ts":12,"values":{"device":"d3","seq":2,"sent_ms":22,"temperature":20.2,"humidity":32}}"##),
        (3, "d3", 7, 17, 27, r##"{"ts":17,"values":{"device":"d3","seq":7,"sent_ms":27,"temperature":20.7,"humidity":37}}"##),
        (3, "d3", 8, 18, 28, r##"{"ts":18,"values":{"device":"d3","seq":8,"sent_ms":28,"temperature":20.8,"humidity":38}}"##),
        (3, "d3", 1000, 1010, 1020, r##"{"ts":1010,"values":{"device":"d3","seq":1000,"sent_ms":1020,"temperature":30.0,"humidity":30}}"##),
    ];
    const SMART_METER_SPEC: &str = r##"{"parts":[{"lit":"{\"ts\":"},{"var":"ts"},{"lit":",\"values\":{\"device\":"},{"var":"device_json"},{"lit":",\"seq\":"},{"var":"seq"},{"lit":",\"sent_ms\":"},{"var":"sent_ms"},{"lit":","},{"pool":["\"pulseCounter\":526417,\"leakage\":false,\"batteryLevel\":19","\"pulseCounter\":232233,\"leakage\":false,\"batteryLevel\":95","\"pulseCounter\":714140,\"leakage\":false,\"batteryLevel\":27","\"pulseCounter\":131503,\"leakage\":false,\"batteryLevel\":25","\"pulseCounter\":364586,\"leakage\":false,\"batteryLevel\":71","\"pulseCounter\":47934,\"leakage\":false,\"batteryLevel\":1","\"pulseCounter\":226008,\"leakage\":false,\"batteryLevel\":40","\"pulseCounter\":462391,\"leakage\":false,\"batteryLevel\":66"],"seq_mul":1,"idx_mul":97,"add":0},{"lit":"}}"}]}"##;
    const SMART_METER_GOLDEN: &[(u64, &str, u64, i64, i64, &str)] = &[
        (0, "monsoon-00000", 0, 1700000000000, 1700000000001, r##"{"ts":1700000000000,"values":{"device":"monsoon-00000","seq":0,"sent_ms":1700000000001,"pulseCounter":526417,"leakage":false,"batteryLevel":19}}"##),
        (5, "dev \"ü\" 😀\\", 149, 1700000000123, 1700000000456, r##"{"ts":1700000000123,"values":{"device":"dev \"\u00fc\" \ud83d\ude00\\","seq":149,"sent_ms":1700000000456,"pulseCounter":714140,"leakage":false,"batteryLevel":27}}"##),
        (1234567, "d7", 6148914691236517205, 42, 43, r##"{"ts":42,"values":{"device":"d7","seq":6148914691236517205,"sent_ms":43,"pulseCounter":364586,"leakage":false,"batteryLevel":71}}"##),
        (3, "d3", 1, 11, 21, r##"{"ts":11,"values":{"device":"d3","seq":1,"sent_ms":21,"pulseCounter":364586,"leakage":false,"batteryLevel":71}}"##),
        (3, "d3", 2, 12, 22, r##"{"ts":12,"values":{"device":"d3","seq":2,"sent_ms":22,"pulseCounter":47934,"leakage":false,"batteryLevel":1}}"##),
        (3, "d3", 7, 17, 27, r##"{"ts":17,"values":{"device":"d3","seq":7,"sent_ms":27,"pulseCounter":714140,"leakage":false,"batteryLevel":27}}"##),
        (3, "d3", 8, 18, 28, r##"{"ts":18,"values":{"device":"d3","seq":8,"sent_ms":28,"pulseCounter":131503,"leakage":false,"batteryLevel":25}}"##),
        (3, "d3", 1000, 1010, 1020, r##"{"ts":1010,"values":{"device":"d3","seq":1000,"sent_ms":1020,"pulseCounter":131503,"leakage":false,"batteryLevel":25}}"##),
    ];
    const SMART_TRACKER_SPEC: &str = r##"{"parts":[{"lit":"{\"ts\":"},{"var":"ts"},{"lit":",\"values\":{\"device\":"},{"var":"device_json"},{"lit":",\"seq\":"},{"var":"seq"},{"lit":",\"sent_ms\":"},{"var":"sent_ms"},{"lit":","},{"pool":["\"latitude\":0.365535,\"longitude\":-163.998861,\"speed\":126.5,\"fuel\":26,\"batteryLevel\":95","\"latitude\":32.590344,\"longitude\":-75.783954,\"speed\":27.7,\"fuel\":93,\"batteryLevel\":25","\"latitude\":-27.414546,\"longitude\":-158.036529,\"speed\":5.9,\"fuel\":33,\"batteryLevel\":1","\"latitude\":-51.203048,\"longitude\":12.088781,\"speed\":57.3,\"fuel\":66,\"batteryLevel\":68","\"latitude\":75.956692,\"longitude\":-160.716348,\"speed\":106.8,\"fuel\":80,\"batteryLevel\":75","\"latitude\":43.969209,\"longitude\":20.719815,\"speed\":44.7,\"fuel\":85,\"batteryLevel\":98","\"latitude\":44.300540,\"longitude\":115.550689,\"speed\":5.2,\"fuel\":5,\"batteryLevel\":25","\"latitude\":47.288230,\"longitude\":-48.168473,\"speed\":42.0,\"fuel\":86,\"batteryLevel\":19"],"seq_mul":1,"idx_mul":97,"add":0},{"lit":"}}"}]}"##;
    const SMART_TRACKER_GOLDEN: &[(u64, &str, u64, i64, i64, &str)] = &[
        (0, "monsoon-00000", 0, 1700000000000, 1700000000001, r##"{"ts":1700000000000,"values":{"device":"monsoon-00000","seq":0,"sent_ms":1700000000001,"latitude":0.365535,"longitude":-163.998861,"speed":126.5,"fuel":26,"batteryLevel":95}}"##),
        (5, "dev \"ü\" 😀\\", 149, 1700000000123, 1700000000456, r##"{"ts":1700000000123,"values":{"device":"dev \"\u00fc\" \ud83d\ude00\\","seq":149,"sent_ms":1700000000456,"latitude":-27.414546,"longitude":-158.036529,"speed":5.9,"fuel":33,"batteryLevel":1}}"##),
        (1234567, "d7", 6148914691236517205, 42, 43, r##"{"ts":42,"values":{"device":"d7","seq":6148914691236517205,"sent_ms":43,"latitude":75.956692,"longitude":-160.716348,"speed":106.8,"fuel":80,"batteryLevel":75}}"##),
        (3, "d3", 1, 11, 21, r##"{"ts":11,"values":{"device":"d3","seq":1,"sent_ms":21,"latitude":75.956692,"longitude":-160.716348,"speed":106.8,"fuel":80,"batteryLevel":75}}"##),
        (3, "d3", 2, 12, 22, r##"{"ts":12,"values":{"device":"d3","seq":2,"sent_ms":22,"latitude":43.969209,"longitude":20.719815,"speed":44.7,"fuel":85,"batteryLevel":98}}"##),
        (3, "d3", 7, 17, 27, r##"{"ts":17,"values":{"device":"d3","seq":7,"sent_ms":27,"latitude":-27.414546,"longitude":-158.036529,"speed":5.9,"fuel":33,"batteryLevel":1}}"##),
        (3, "d3", 8, 18, 28, r##"{"ts":18,"values":{"device":"d3","seq":8,"sent_ms":28,"latitude":-51.203048,"longitude":12.088781,"speed":57.3,"fuel":66,"batteryLevel":68}}"##),
        (3, "d3", 1000, 1010, 1020, r##"{"ts":1010,"values":{"device":"d3","seq":1000,"sent_ms":1020,"latitude":-51.203048,"longitude":12.088781,"speed":57.3,"fuel":66,"batteryLevel":68}}"##),
    ];
    const PLC_SPEC: &str = r##"{"parts":[{"lit":"{\"ts\":"},{"var":"ts"},{"lit":",\"values\":{\"device\":"},{"var":"device_json"},{"lit":",\"seq\":"},{"var":"seq"},{"lit":",\"sent_ms\":"},{"var":"sent_ms"},{"lit":","},{"pool":["\"line000\":50.20307519713651,\"line001\":4.444760942078396,\"line002\":97.32161851337221","\"line000\":87.44369239269142,\"line001\":99.32817648929777,\"line002\":68.105746568557","\"line000\":28.948901541750203,\"line001\":21.336896065929135,\"line002\":73.19745417944013","\"line000\":20.179692914856197,\"line001\":66.89482410327318,\"line002\":56.09278607794168","\"line000\":42.5340006199026,\"line001\":1.464695644034908,\"line002\":36.42171959100659","\"line000\":31.614128083714043,\"line001\":96.89456740051118,\"line002\":51.691130201666645","\"line000\":92.19816204048557,\"line001\":5.356570128540749,\"line002\":82.13684243624334","\"line000\":62.58353038727114,\"line001\":74.42733853498939,\"line002\":55.75550412620991"],"seq_mul":1,"idx_mul":97,"add":0},{"lit":"}}"}]}"##;
    const PLC_GOLDEN: &[(u64, &str, u64, i64, i64, &str)] = &[
        (0, "monsoon-00000", 0, 1700000000000, 1700000000001, r##"{"ts":1700000000000,"values":{"device":"monsoon-00000","seq":0,"sent_ms":1700000000001,"line000":50.20307519713651,"line001":4.444760942078396,"line002":97.32161851337221}}"##),
        (5, "dev \"ü\" 😀\\", 149, 1700000000123, 1700000000456, r##"{"ts":1700000000123,"values":{"device":"dev \"\u00fc\" \ud83d\ude00\\","seq":149,"sent_ms":1700000000456,"line000":28.948901541750203,"line001":21.336896065929135,"line002":73.19745417944013}}"##),
        (1234567, "d7", 6148914691236517205, 42, 43, r##"{"ts":42,"values":{"device":"d7","seq":6148914691236517205,"sent_ms":43,"line000":42.5340006199026,"line001":1.464695644034908,"line002":36.42171959100659}}"##),
        (3, "d3", 1, 11, 21, r##"{"ts":11,"values":{"device":"d3","seq":1,"sent_ms":21,"line000":42.5340006199026,"line001":1.464695644034908,"line002":36.42171959100659}}"##),
        (3, "d3", 2, 12, 22, r##"{"ts":12,"values":{"device":"d3","seq":2,"sent_ms":22,"line000":31.614128083714043,"line001":96.89456740051118,"line002":51.691130201666645}}"##),
        (3, "d3", 7, 17, 27, r##"{"ts":17,"values":{"device":"d3","seq":7,"sent_ms":27,"line000":28.948901541750203,"line001":21.336896065929135,"line002":73.19745417944013}}"##),
        (3, "d3", 8, 18, 28, r##"{"ts":18,"values":{"device":"d3","seq":8,"sent_ms":28,"line000":20.179692914856197,"line001":66.89482410327318,"line002":56.09278607794168}}"##),
        (3, "d3", 1000, 1010, 1020, r##"{"ts":1010,"values":{"device":"d3","seq":1000,"sent_ms":1020,"line000":20.179692914856197,"line001":66.89482410327318,"line002":56.09278607794168}}"##),
    ];
    const TEMPLATE_SPEC: &str = r##"{"parts":[{"lit":"{\"id\":\""},{"var":"device_raw"},{"lit":"\",\"n\":"},{"var":"seq"},{"lit":",\"at\":"},{"var":"ts"},{"lit":",\"s\":"},{"var":"sent_ms"},{"lit":",\"pct\":\"50%\",\"i\":"},{"pool":["8","0","2","3","3","4","3","2"],"seq_mul":40503,"idx_mul":9973,"add":0},{"lit":",\"f\":"},{"pool":["1.10","0.30","1.00","0.84","0.64","0.02","0.55","0.47"],"seq_mul":40503,"idx_mul":9973,"add":131},{"lit":",\"j\":"},{"pool":["1","1","-1","-3","2","3","3","2"],"seq_mul":40503,"idx_mul":9973,"add":262},{"lit":"}"}]}"##;
    const TEMPLATE_GOLDEN: &[(u64, &str, u64, i64, i64, &str)] = &[
        (0, "monsoon-00000", 0, 1700000000000, 1700000000001, r##"{"id":"monsoon-00000","n":0,"at":1700000000000,"s":1700000000001,"pct":"50%","i":8,"f":0.84,"j":3}"##),
        (5, "dev \"ü\" 😀\\", 149, 1700000000123, 1700000000456, r##"{"id":"dev \"\u00fc\" \ud83d\ude00\\","n":149,"at":1700000000123,"s":1700000000456,"pct":"50%","i":3,"f":0.47,"j":-1}"##),
        (1234567, "d7", 6148914691236517205, 42, 43, r##"{"id":"d7","n":6148914691236517205,"at":42,"s":43,"pct":"50%","i":3,"f":0.30,"j":2}"##),
        (3, "d3", 1, 11, 21, r##"{"id":"d3","n":1,"at":11,"s":21,"pct":"50%","i":3,"f":0.30,"j":2}"##),
        (3, "d3", 2, 12, 22, r##"{"id":"d3","n":2,"at":12,"s":22,"pct":"50%","i":4,"f":1.10,"j":-3}"##),
        (3, "d3", 7, 17, 27, r##"{"id":"d3","n":7,"at":17,"s":27,"pct":"50%","i":8,"f":0.84,"j":3}"##),
        (3, "d3", 8, 18, 28, r##"{"id":"d3","n":8,"at":18,"s":28,"pct":"50%","i":2,"f":1.00,"j":3}"##),
        (3, "d3", 1000, 1010, 1020, r##"{"id":"d3","n":1000,"at":1010,"s":1020,"pct":"50%","i":2,"f":1.00,"j":3}"##),
    ];

    const TEMPS: &str = "20.0,20.1,20.2,20.3,20.4,20.5,20.6,20.7,20.8,20.9,21.0,21.1,21.2,21.3,21.4,21.5,21.6,21.7,21.8,21.9,22.0,22.1,22.2,22.3,22.4,22.5,22.6,22.7,22.8,22.9,23.0,23.1,23.2,23.3,23.4,23.5,23.6,23.7,23.8,23.9,24.0,24.1,24.2,24.3,24.4,24.5,24.6,24.7,24.8,24.9,25.0,25.1,25.2,25.3,25.4,25.5,25.6,25.7,25.8,25.9,26.0,26.1,26.2,26.3,26.4,26.5,26.6,26.7,26.8,26.9,27.0,27.1,27.2,27.3,27.4,27.5,27.6,27.7,27.8,27.9,28.0,28.1,28.2,28.3,28.4,28.5,28.6,28.7,28.8,28.9,29.0,29.1,29.2,29.3,29.4,29.5,29.6,29.7,29.8,29.9,30.0,30.1,30.2,30.3,30.4,30.5,30.6,30.7,30.8,30.9,31.0,31.1,31.2,31.3,31.4,31.5,31.6,31.7,31.8,31.9,32.0,32.1,32.2,32.3,32.4,32.5,32.6,32.7,32.8,32.9,33.0,33.1,33.2,33.3,33.4,33.5,33.6,33.7,33.8,33.9,34.0,34.1,34.2,34.3,34.4,34.5,34.6,34.7,34.8,34.9,20.0";

    fn composer(spec_json: &str) -> Composer {
        let spec: PayloadSpec = serde_json::from_str(spec_json).expect("spec parses");
        Composer::new(&spec).expect("spec compiles")
    }

    fn render(c: &Composer, idx: u64, name: &str, seq: u64, ts: i64, sent_ms: i64) -> String {
        let raw = json_escape(name);
        let mut out = Vec::new();
        c.render(&mut out, idx, raw.as_bytes(), seq, ts, sent_ms);
        String::from_utf8(out).expect("payloads are UTF-8 (ASCII, in fact)")
    }

    fn check_golden(c: &Composer, golden: &[Golden]) {
        for &(idx, name, seq, ts, sent_ms, want) in golden {
            let got = render(c, idx, name, seq, ts, sent_ms);
            assert_eq!(got, want, "idx={idx} name={name:?} seq={seq}");
        }
        // the engine's way: one Stamps carried from message to message, each golden line twice in a row
        let mut stamps = Stamps::default();
        for &(idx, name, seq, ts, sent_ms, want) in golden.iter().flat_map(|g| [g, g]) {
            let mut out = Vec::new();
            c.render_with(&mut out, &mut stamps, idx, json_escape(name).as_bytes(), seq, ts, sent_ms);
            assert_eq!(String::from_utf8(out).unwrap(), want, "render_with: idx={idx} seq={seq}");
        }
    }

    #[test]
    fn last_num_is_itoa_whatever_came_before() {
        let mut n = LastNum::default();
        for v in [0i64, 0, 7, 7, 1_700_000_000_000, 1_700_000_000_000, -1, i64::MIN, i64::MAX, 0, 10, 1] {
            assert_eq!(n.text(v), itoa::Buffer::new().format(v).as_bytes(), "{v}");
        }
    }

    /// A built-in profile's payload: ThingsBoard's timestamped form with device, seq, sent_ms.
    fn check_builtin_shape(c: &Composer, golden: &[Golden], keys: &[&str]) {
        for &(idx, name, seq, ts, sent_ms, _) in golden {
            let text = render(c, idx, name, seq, ts, sent_ms);
            assert!(text.is_ascii(), "{text}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(v["ts"].as_i64(), Some(ts));
            let vals = v["values"].as_object().unwrap();
            assert_eq!(vals["device"].as_str(), Some(name));
            assert_eq!(vals["seq"].as_u64(), Some(seq));
            assert_eq!(vals["sent_ms"].as_i64(), Some(sent_ms));
            for k in keys {
                assert!(vals.contains_key(*k), "{k} missing in {text}");
            }
            assert_eq!(vals.len(), 3 + keys.len(), "{text}");
        }
    }

    #[test]
    fn minimal_profile_matches_python() {
        // the default (no parts) and Python's explicit spec compose the same bytes
        check_golden(&Composer::new(&PayloadSpec::default()).unwrap(), MINIMAL_GOLDEN);
        check_golden(&composer(r#"{"parts": []}"#), MINIMAL_GOLDEN);
        check_golden(&composer("{}"), MINIMAL_GOLDEN);
        check_golden(&composer(MINIMAL_SPEC), MINIMAL_GOLDEN);
        check_builtin_shape(&composer(MINIMAL_SPEC), MINIMAL_GOLDEN, &["temperature", "humidity"]);
    }

    #[test]
    fn smart_meter_matches_python() {
        let c = composer(SMART_METER_SPEC);
        check_golden(&c, SMART_METER_GOLDEN);
        check_builtin_shape(&c, SMART_METER_GOLDEN, &["pulseCounter", "leakage", "batteryLevel"]);
    }

    #[test]
    fn smart_tracker_matches_python() {
        let c = composer(SMART_TRACKER_SPEC);
        check_golden(&c, SMART_TRACKER_GOLDEN);
        check_builtin_shape(&c, SMART_TRACKER_GOLDEN, &["latitude", "longitude", "speed", "fuel", "batteryLevel"]);
    }

    #[test]
    fn industrial_plc_matches_python() {
        let c = composer(PLC_SPEC);
        check_golden(&c, PLC_GOLDEN);
        check_builtin_shape(&c, PLC_GOLDEN, &["line000", "line001", "line002"]);
    }

    #[test]
    fn template_matches_python() {
        // device_raw (no quotes), a literal % (the %-format's %%), three pools with add = 0/131/262
        let c = composer(TEMPLATE_SPEC);
        check_golden(&c, TEMPLATE_GOLDEN);
        for &(idx, name, seq, ts, sent_ms, _) in TEMPLATE_GOLDEN {
            let text = render(&c, idx, name, seq, ts, sent_ms);
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(v["id"].as_str(), Some(name));
            assert_eq!(v["n"].as_u64(), Some(seq));
            assert_eq!(v["at"].as_i64(), Some(ts));
            assert_eq!(v["s"].as_i64(), Some(sent_ms));
            assert_eq!(v["pct"].as_str(), Some("50%"));
            assert!((0..=9).contains(&v["i"].as_i64().unwrap()));
            assert!((-3..=3).contains(&v["j"].as_i64().unwrap()));
            let f = v["f"].as_f64().unwrap();
            assert!((0.0..=1.5).contains(&f));
        }
    }

    #[test]
    fn same_input_same_bytes_and_seq_moves_the_pool() {
        let c = composer(SMART_METER_SPEC);
        let a = render(&c, 3, "d3", 17, 1, 2);
        assert_eq!(a, render(&c, 3, "d3", 17, 1, 2));
        assert_eq!(a, render(&composer(SMART_METER_SPEC), 3, "d3", 17, 1, 2));
        // built-in profiles index the pool by seq + 97*idx: one device walks the whole pool
        let tails: std::collections::BTreeSet<String> = (0..8)
            .map(|s| render(&c, 3, "d3", s, 1, 2).split(",\"pulseCounter\"").nth(1).unwrap().to_string())
            .collect();
        assert_eq!(tails.len(), 8, "8 seqs of one device = the 8 distinct pool entries");
        assert_eq!(render(&c, 3, "d3", 8, 1, 2), render(&c, 3, "d3", 0, 1, 2).replace("\"seq\":0", "\"seq\":8"));
    }

    #[test]
    fn temperature_and_humidity_format_like_python() {
        // f"{20.0 + (seq % 150) / 10:.1f}" for seq = 0..=150, from Python
        let want: Vec<&str> = TEMPS.split(',').collect();
        assert_eq!(want.len(), 151);
        let c = composer(r#"{"parts": [{"var": "temperature"}, {"lit": "/"}, {"var": "humidity"}]}"#);
        for seq in 0..=150u64 {
            for base in [0, 150 * 1_000_000_007] {
                let got = render(&c, 0, "x", base + seq, 0, 0);
                assert_eq!(got, format!("{}/{}", want[seq as usize], 30 + (base + seq) % 50));
            }
        }
        assert_eq!(render(&c, 0, "x", u64::MAX, 0, 0), "21.5/45"); // 2^64-1 = 15 mod 150 and mod 50
    }

    #[test]
    fn every_variable_and_its_aliases() {
        let c = composer(
            r#"{"parts": [{"var": "ts"}, {"lit": "|"}, {"var": "seq"}, {"lit": "|"}, {"var": "sent_ms"},
                {"lit": "|"}, {"var": "device_json"}, {"lit": "|"}, {"var": "device_raw"}, {"lit": "|"},
                {"var": "device"}]}"#,
        );
        assert_eq!(render(&c, 9, "a\"b", 7, -5, i64::MAX), "-5|7|9223372036854775807|\"a\\\"b\"|a\\\"b|a\\\"b");
        assert_eq!(render(&c, 0, "", u64::MAX, i64::MIN, 0), "-9223372036854775808|18446744073709551615|0|\"\"||");
    }

    #[test]
    fn render_appends_to_the_buffer() {
        let c = composer(r#"{"parts": [{"lit": "x"}, {"var": "seq"}]}"#);
        let mut out = b"head:".to_vec();
        c.render(&mut out, 0, b"d", 12, 0, 0);
        c.render(&mut out, 0, b"d", 3, 0, 0);
        assert_eq!(out, b"head:x12x3");
    }

    #[test]
    fn pool_index_is_seq_times_a_plus_idx_times_b_plus_c_masked() {
        let pool: Vec<String> = (0..16).map(|i| format!("p{i}")).collect();
        let spec = serde_json::json!({"parts": [{"pool": pool, "seq_mul": 40503, "idx_mul": 9973, "add": 262}]});
        let c = Composer::new(&serde_json::from_value(spec).unwrap()).unwrap();
        for (seq, idx) in [(0u64, 0u64), (1, 0), (0, 1), (12345, 77), (u64::MAX, 3), (1 << 63, u64::MAX), (u64::MAX, u64::MAX)] {
            // Python's unbounded ints; the low 4 bits do not care about the wrap at 2^64
            let i = (seq as u128 * 40503 + idx as u128 * 9973 + 262) & 15;
            assert_eq!(render(&c, idx, "d", seq, 0, 0), format!("p{i}"), "seq={seq} idx={idx}");
        }
        // a one-entry pool is a constant
        let c = composer(r#"{"parts": [{"pool": ["only"], "seq_mul": 1, "idx_mul": 97, "add": 0}]}"#);
        assert_eq!(render(&c, 5, "d", 99, 0, 0), "only");
    }

    #[test]
    fn bad_specs_are_refused() {
        for n in [0usize, 3, 5, 6, 1000, 1023] {
            let pool: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            let spec = serde_json::json!({"parts": [{"pool": pool, "seq_mul": 1, "idx_mul": 1, "add": 0}]});
            let e = Composer::new(&serde_json::from_value(spec).unwrap()).err().expect("refused");
            assert_eq!(e, "payload pool size must be a power of two", "n={n}");
        }
        for n in [1usize, 2, 4, 1024] {
            let pool: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            let spec = serde_json::json!({"parts": [{"pool": pool, "seq_mul": 1, "idx_mul": 1, "add": 0}]});
            assert!(Composer::new(&serde_json::from_value(spec).unwrap()).is_ok(), "n={n}");
        }
        let spec: PayloadSpec = serde_json::from_str(r#"{"parts": [{"var": "rand_int"}]}"#).unwrap();
        assert_eq!(Composer::new(&spec).err().unwrap(), "unknown payload variable \"rand_int\"");
        // a part that is none of lit / var / pool (a pool without its multipliers, say) does not parse
        for bad in [r#"{"parts": [{"pool": ["a"]}]}"#, r#"{"parts": [{"text": "a"}]}"#, r#"{"parts": [{"lit": 5}]}"#] {
            assert!(serde_json::from_str::<PayloadSpec>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_escape_is_python_json_dumps_without_quotes() {
        // (input, json.dumps(input)[1:-1]) from Python (ensure_ascii=True, its default)
        let cases = [
            ("\u{0}\u{1f}\u{8}\u{c}\n\r\t", r"\u0000\u001f\b\f\n\r\t"),
            ("é", r"\u00e9"),
            ("😀", r"\ud83d\ude00"),
            ("\u{2028}", r"\u2028"),
            ("a\"b\\c", r#"a\"b\\c"#),
            ("/", "/"),
            ("~ plain-ASCII_01", "~ plain-ASCII_01"),
            ("", ""),
        ];
        for (s, want) in cases {
            assert_eq!(json_escape(s), want, "{s:?}");
            // and it is a valid JSON string body that reads back as the input
            let back: String = serde_json::from_str(&format!("\"{}\"", json_escape(s))).unwrap();
            assert_eq!(back, s);
        }
    }

    /// Python's `json.dumps` (ensure_ascii) escapes DEL (0x7F) as `\u007f` -- its ESCAPE_ASCII class is
    /// "not in [ -~]" -- so a device name with DEL renders byte-identically in both engines.
    #[test]
    fn json_escape_escapes_del_like_python() {
        assert_eq!(json_escape("\u{7f}"), r"\u007f"); // json.dumps("\x7f") == '"\\u007f"'
        assert_eq!(json_escape("a\u{7f}b"), r"a\u007fb");
    }
}
