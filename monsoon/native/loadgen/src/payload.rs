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
            c if (c as u32) < 0x20 || (c as u32) > 0x7E && (c as u32) != 0x7F => {
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
    #[inline]
    pub fn render(&self, out: &mut Vec<u8>, idx: u64, raw: &[u8], seq: u64, ts: i64, sent_ms: i64) {
        let mut ib = itoa::Buffer::new();
        for p in &self.parts {
            match p {
                Part::Lit(b) => out.extend_from_slice(b),
                Part::Var(v) => match v {
                    Var::Ts => out.extend_from_slice(ib.format(ts).as_bytes()),
                    Var::Seq => out.extend_from_slice(ib.format(seq).as_bytes()),
                    Var::SentMs => out.extend_from_slice(ib.format(sent_ms).as_bytes()),
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
