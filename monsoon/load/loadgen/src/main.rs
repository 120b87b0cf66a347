//! monsoon-loadgen — monsoon's native open-model MQTT 3.1.1 load generator and ack-only sink.
//!
//! USAGE
//!   monsoon-loadgen run --config FILE.json [--shard i/n | --shard auto/n] [--wait-start]
//!   monsoon-loadgen sink --port P [--threads N]
//!   monsoon-loadgen schedule --config FILE.json [--shard i/n] [--limit N]
//!   monsoon-loadgen floor --port P [--connections N] [--messages M] [--batch B] [--rate R [--tick-ms T]]
//!
//! run: one connection per device (clean session, username = device token, password = the
//!   device's password where it has one, client id =
//!   client_id_prefix + name), one epoll loop on one thread. Config (JSON): host, port,
//!   qos (0|1), topic, client_id_prefix, devices ([{name, token, password?}] or a CSV path with
//!   name,token), segments [[start_s, end_s, rate_msg_s], ...] (monsoon.load.schedule.Schedule's),
//!   late_tolerance_ms, payload ({parts: [...]}, from Payload.native_spec(); empty = minimal),
//!   acked_path ("{shard}" is replaced by the shard index), source_addrs (each client socket
//!   is bound to one of them before connect, round-robin by device index), connect_rate
//!   (connections/s, 0 = unlimited), max_pending_connects, keepalive_s, drain_timeout_s,
//!   connect_timeout_s, hist (bool: per-second HdrHistogram), start_at_unix_ms.
//!   Message k (global, computed on the absolute schedule exactly like Schedule.__iter__)
//!   goes to device k % D. `--shard i/n` takes devices [i*D/n, (i+1)*D/n) and sends only
//!   their messages; `--shard auto/n` reads i from JOB_COMPLETION_INDEX (Kubernetes
//!   Indexed Job). `--wait-start` connects, then waits for a line `start [unix_ms]` on
//!   stdin; stdin EOF or `stop` stops the run.
//!   Stdout, one JSON object per line: {"event":"connected",...} once all devices have a
//!   CONNACK (or {"error": ...} and exit 3), then per second {t, target_rate, scheduled,
//!   sent, acked, failed, late, dropped, connected, inflight, p50_ms, p99_ms, max_ms, hist}
//!   and finally {"totals": {scheduled, sent, acked, failed, late, dropped, unacked,
//!   last_seq, p50_ms, p99_ms, max_ms, reconnects, elapsed_s, lost_in_flight,
//!   send_late_p99_ms, send_late_max_ms, hist, send_late_hist}}.
//!   Latency = PUBACK time - intended send time (no coordinated omission), in the
//!   HdrHistogram (1 us .. 1 h, 2 digits) whose V2-compressed base64 goes in `hist`.
//!   Open model: a stalled broker never slows the schedule: a due message is always
//!   composed and queued on its connection (`sent`, or `failed` if the device is not
//!   connected), and written as soon as the socket takes it; a message whose last byte the
//!   kernel accepted more than late_tolerance_ms after its intended time is `late` (so a
//!   stalled broker that fills the socket buffers, or a starved generator, shows as late;
//!   `send_late_*` is that delay's distribution). Messages due but not sent when stopped
//!   (SIGTERM/SIGINT/stdin) are `dropped`. acked.csv: device,seq,intended_ms,acked_ms.
//!
//! run with `"transport": "hono-coap"` (config keys kinds, ttd_s, leg_timeout_s): CoAP over DTLS with PSK, Hono's
//!   CoAP device flow; see honocoap.rs. coap-sink: its DTLS endpoint for tests and the benchmark (coapsink.rs).
//!
//! sink: ack-only MQTT 3.1.1 server on 127.0.0.1:P (SO_REUSEPORT: threads and processes
//!   share the port). CONNACK, PUBACK per QoS1 PUBLISH, PINGRESP, SUBACK; no routing.
//!
//! schedule: prints `k device intended_s` of the shard's messages (for tests).
mod coap;
mod coapsink;
mod dtls;
mod floor;
mod gen;
mod honocoap;
mod mqtt;
mod payload;
mod schedule;
mod sink;

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

const HELP: &str = "monsoon-loadgen — open-model MQTT 3.1.1 load generator and ack-only sink

USAGE:
  monsoon-loadgen --version
  monsoon-loadgen run --config FILE.json [--shard i/n | --shard auto/n] [--wait-start]
  monsoon-loadgen sink --port P [--threads N]
  monsoon-loadgen schedule --config FILE.json [--shard i/n] [--limit N]
  monsoon-loadgen floor --port P [--connections N] [--messages M] [--batch B] [--rate R [--tick-ms T]]

run       connect every device of the shard, publish the schedule, print one JSON line per
          second and a final {\"totals\": ...} line. --shard auto/n reads the shard index from
          JOB_COMPLETION_INDEX. --wait-start: wait for `start [unix_ms]` on stdin (EOF = stop).
          SIGTERM/SIGINT stop cleanly (totals are printed). See the module doc for the config.
sink      ack-only MQTT server on 127.0.0.1:P with SO_REUSEPORT (CONNACK, PUBACK, PINGRESP).
schedule  print `k device intended_s` for the shard's messages (testing aid).
floor     --port P [--connections 50] [--messages 1000000] [--batch 10]: the transport's cost alone
          (pre-encoded QoS 1 publishes, `batch` per write, against a sink); one JSON line with CPU/msg.
          --rate R: paced on the engine's clock instead (a wake-up every --tick-ms, default 5, writing
          what R made due, each connection's share in one write): what pacing itself costs.
coap-sink CoAP over DTLS (PSK) on 127.0.0.1:P answering as Hono's CoAP adapter (2.04; a command to every
          --command-every-th hono-ttd query, default 1, 0 = none; 5.03 to every --fail-every-th POST, default 0
          = none; every --separate-every-th an empty ACK, then a separate response). --keys: the devices ([{token, password}] or a run config): identity = token, key =
          SHA-256(password)[..16]. Prints {\"event\": \"listening\", \"port\": P}, and its counts on SIGTERM.
          `run` speaks this transport with \"transport\": \"hono-coap\" in its config (see honocoap.rs).
";

/// `monsoon-loadgen <crate version>`: what `--version` prints (the crate's version, which monsoon's wheel carries).
fn version_line() -> String {
    format!("monsoon-loadgen {}", env!("CARGO_PKG_VERSION"))
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("--shard wants i/n, got {s:?}"))?;
    let n: usize = n.parse().map_err(|_| format!("--shard: bad count {n:?}"))?;
    let i: usize = if i == "auto" {
        let v = std::env::var("JOB_COMPLETION_INDEX")
            .map_err(|_| "--shard auto/n needs the JOB_COMPLETION_INDEX environment variable".to_string())?;
        v.trim().parse().map_err(|_| format!("JOB_COMPLETION_INDEX={v:?} is not an integer"))?
    } else {
        i.parse().map_err(|_| format!("--shard: bad index {i:?}"))?
    };
    if n == 0 || i >= n {
        return Err(format!("--shard {i}/{n}: need 0 <= i < n"));
    }
    Ok((i, n))
}

fn real_main() -> Result<i32, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--version" || a == "-V") {
        println!("{}", version_line());
        return Ok(0);
    }
    if args.is_empty() || args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return Ok(if args.is_empty() { 2 } else { 0 });
    }
    let cmd = args[0].as_str();
    let mut config = None;
    let mut shard = (0usize, 1usize);
    let mut port: Option<u16> = None;
    let mut threads = 1usize;
    let mut wait_start = false;
    let mut limit = u64::MAX;
    let (mut connections, mut messages, mut batch) = (50usize, 1_000_000u64, 10usize);
    let (mut rate, mut tick_ms) = (0.0f64, 5.0f64);
    let (mut keys, mut command_every, mut fail_every, mut separate_every) = (None, 1u64, 0u64, 0u64);
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--config" => config = Some(val()?),
            "--shard" => shard = parse_shard(&val()?)?,
            "--port" => port = Some(val()?.parse().map_err(|_| "--port: not a port".to_string())?),
            "--threads" => threads = val()?.parse().map_err(|_| "--threads: not a number".to_string())?,
            "--limit" => limit = val()?.parse().map_err(|_| "--limit: not a number".to_string())?,
            "--wait-start" => wait_start = true,
            "--connections" => connections = val()?.parse().map_err(|_| "--connections: not a number".to_string())?,
            "--messages" => messages = val()?.parse().map_err(|_| "--messages: not a number".to_string())?,
            "--batch" => batch = val()?.parse().map_err(|_| "--batch: not a number".to_string())?,
            "--rate" => rate = val()?.parse().map_err(|_| "--rate: not a number".to_string())?,
            "--tick-ms" => tick_ms = val()?.parse().map_err(|_| "--tick-ms: not a number".to_string())?,
            "--keys" => keys = Some(val()?),
            "--command-every" => command_every = val()?.parse().map_err(|_| "--command-every: not a number".to_string())?,
            "--fail-every" => fail_every = val()?.parse().map_err(|_| "--fail-every: not a number".to_string())?,
            "--separate-every" => {
                separate_every = val()?.parse().map_err(|_| "--separate-every: not a number".to_string())?
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| e.to_string())?;
    }
    let read_config = |p: &Option<String>| -> Result<gen::Config, String> {
        let p = p.as_ref().ok_or("--config FILE.json is required")?;
        let text = std::fs::read_to_string(p).map_err(|e| format!("config {p}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("config {p}: {e}"))
    };
    match cmd {
        "floor" => floor::run(port.ok_or("floor needs --port P")?, connections, messages, batch, rate, tick_ms),
        "sink" => sink::run(port.ok_or("sink needs --port P")?, threads, stop),
        "coap-sink" => coapsink::run(
            coapsink::Opts {
                port: port.ok_or("coap-sink needs --port P")?,
                threads,
                keys: coapsink::load_keys(&keys.ok_or("coap-sink needs --keys DEVICES.json")?)?,
                command_every,
                fail_every,
                separate_every,
            },
            stop,
        ),
        "run" => {
            let cfg = read_config(&config)?;
            let start_ms = Arc::new(AtomicI64::new(0));
            if wait_start {
                let (stop, start_ms) = (stop.clone(), start_ms.clone());
                std::thread::spawn(move || {
                    let stdin = std::io::stdin();
                    for line in stdin.lock().lines() {
                        let Ok(line) = line else { break };
                        let mut w = line.split_whitespace();
                        match w.next() {
                            Some("start") => {
                                let ms = w.next().and_then(|x| x.parse::<i64>().ok()).unwrap_or(-1);
                                start_ms.store(if ms == 0 { -1 } else { ms }, Ordering::SeqCst);
                            }
                            Some("stop") => break,
                            _ => {}
                        }
                    }
                    stop.store(true, Ordering::SeqCst);
                });
            }
            gen::run(cfg, shard, gen::Control { stop, start_ms, wait_start })
        }
        "schedule" => {
            let cfg = read_config(&config)?;
            let devs = gen::load_devices(&cfg.devices)?;
            let (lo, hi) = gen::shard_range(devs.len(), shard.0, shard.1);
            let plans = schedule::plan(&cfg.segments)?;
            let mut s = schedule::ShardSchedule::new(plans, devs.len() as u64, lo as u64, hi as u64);
            use std::io::Write;
            let out = std::io::stdout();
            let mut o = std::io::BufWriter::new(out.lock());
            let mut n = 0;
            while let Some((k, d, t)) = s.next() {
                if n >= limit {
                    break;
                }
                let _ = writeln!(o, "{k} {d} {t:?}");
                n += 1;
            }
            Ok(0)
        }
        other => Err(format!("unknown command {other:?} (see --help)")),
    }
}

fn main() {
    match real_main() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("monsoon-loadgen: {e}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_shard, version_line};

    #[test]
    fn version() {
        assert_eq!(version_line(), format!("monsoon-loadgen {}", env!("CARGO_PKG_VERSION")));
        assert!(version_line().starts_with("monsoon-loadgen 0."));
    }

    #[test]
    fn shard_argument() {
        assert_eq!(parse_shard("0/1"), Ok((0, 1)));
        assert_eq!(parse_shard("2/3"), Ok((2, 3)));
        for bad in ["3/3", "0/0", "1", "x/2", "1/y", "-1/2", ""] {
            assert!(parse_shard(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_shard("3/3").unwrap_err(), "--shard 3/3: need 0 <= i < n");
    }
}
