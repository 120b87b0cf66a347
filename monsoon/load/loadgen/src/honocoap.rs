//! `monsoon-loadgen run` with `"transport": "hono-coap"`: devices on Eclipse Hono's CoAP adapter over DTLS 1.2
//! with a pre-shared key (identity = the device's token, `<auth-id>@<tenant>`; key = SHA-256(password)[..16],
//! `monsoon.stack.provision.psk_key`), as `monsoon.load.coap.HonoCoapFleet` does in Python, on one mio loop:
//! one connected UDP socket and one OpenSSL DTLS session per device, handshakes non-blocking (DTLS retransmit
//! timers driven by the loop).
//!
//! Every request is a confirmable POST (Content-Format 50), at most one outstanding per device (NSTART = 1; due
//! messages wait in the device's queue, and a message written more than late_tolerance_ms after its time is
//! late). Message k's kind is `kinds[(seq + device index) % len]` (`monsoon.load.hono.leg_cycle`):
//! `telemetry` (`POST /telemetry`), `event` (`POST /event`) or `command` (`POST /telemetry?hono-ttd=<ttd_s>`;
//! a 2.xx with `Location-Path: command_response/<req-id>` carries a command, which the device answers next with
//! `POST /command_response/<req-id>?hono-cmd-status=200`). A message is acked by the 2.xx of its first request;
//! an error code, a timeout (leg_timeout_s, + ttd_s for a query) or a broken session fails it, counted by
//! cause (`coap 5.03`, `timeout`, `connection ...`). The four legs (telemetry, event, command_request,
//! command_response) are measured request to response: each second's line has `legs` ({leg: {ok, codes,
//! hist}} for the legs with an outcome that second), the totals line their totals. CoAP retransmits an unanswered request at 2, 4, 8 and 16 s (ACK_TIMEOUT 2 s),
//! stops on an empty ACK (a separate response follows) and ACKs a confirmable separate response.
//! A device whose session was up handshakes again (a new socket, a new session; `reconnects` in the totals) when
//! an exchange times out without even a CoAP ACK (the other side forgot the session: a pod killed behind a
//! Service), or 1 s after the session broke (an alert, a refused datagram); what comes due meanwhile waits in its
//! queue. A handshake not complete within 5 s begins again on a new socket (`dtls_handshake_restarts`).
//! The lines printed are those of the MQTT engine (see main.rs), plus `errors` and `legs` in the totals.
use crate::coap::{self, Builder, Msg};
use crate::dtls::{self, Psk, UdpIo};
use crate::gen::{cpu_s, encode_hist, raise_nofile_pub, Config, Control, Shard};
use crate::payload::{json_escape, Composer};
use crate::schedule::{plan, ShardSchedule};
use hdrhistogram::Histogram;
use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token};
use openssl::ssl::{ErrorCode, SslContext, SslStream};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const HIST_MAX_US: u64 = 3_600_000_000;
pub const LEGS: [&str; 4] = ["telemetry", "event", "command_request", "command_response"];
const TELEMETRY: u8 = 0;
const EVENT: u8 = 1;
const COMMAND: u8 = 2; // the kind `command`: its first leg is command_request
const CMD_RESPONSE: u8 = 3;
const NO_COMMAND: &str = "no command";
const ACK_TIMEOUT_S: f64 = 2.0;
const MAX_RETRANSMIT: u32 = 4;
/// seconds a device that lost its session waits before it handshakes again
const RETRY_S: f64 = 1.0;
/// seconds a handshake may go without completing before the device gives it up and starts a new one on a new
/// socket (OpenSSL's DTLS timer doubles from 1 s: its fourth retransmit would come 15 s in, its fifth 31 s in)
const HANDSHAKE_RESTART_S: f64 = 5.0;

#[derive(PartialEq, Eq, Clone, Copy, Debug)]
enum St {
    Idle,
    Handshake,
    Up,
    Down,
}

struct Due {
    seq: u64,
    intended: f64,
    ts: i64,
    /// it found its device busy (an exchange outstanding or messages ahead of it): if it goes out late, the
    /// lateness is the endpoint's, which held the device's one exchange (NSTART = 1), and is counted `held` too
    waited: bool,
}

struct Ex {
    leg: u8,
    seq: u64,
    intended: f64,
    ts: i64,
    start: f64,
    mid: u16,
    token: [u8; 4],
    dgram: Vec<u8>,
    retx_at: f64,
    retx_n: u32,
    deadline: f64,
    got_ack: bool,
}

struct Dev {
    gidx: u64,
    name: String,
    raw: Vec<u8>,
    identity: Vec<u8>,
    key: Vec<u8>,
    src: Option<IpAddr>,
    stream: Option<SslStream<UdpIo>>,
    st: St,
    next_seq: u64,
    last_ts: i64,
    queue: VecDeque<Due>,
    ex: Option<Ex>,
    cmd_resp: Option<(String, u64)>,
    mid: u16,
    tok: u32,
    spare: Vec<u8>,
    /// a datagram came back during the handshake (the endpoint answers)
    heard: bool,
    /// its session was up once: a later handshake is a re-handshake (its failure fails the device, not the run)
    was_up: bool,
    /// when a device that was up and lost its session tries a new one (0: not waiting)
    retry_at: f64,
    /// when its current handshake began
    hs_at: f64,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    scheduled: i64,
    sent: i64,
    acked: i64,
    failed: i64,
    late: i64,
    /// late sends that waited behind their device's outstanding exchange (the `held` of the Python fleets)
    held: i64,
    dropped: i64,
}

struct Leg {
    ok: u64,
    codes: BTreeMap<String, u64>,
    hist: Histogram<u64>,
    /// this second's: successes, outcomes other than ok, round trips
    sec_ok: u64,
    sec_codes: BTreeMap<String, u64>,
    hist_sec: Histogram<u64>,
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 2).unwrap()
}

fn rec(h: &mut Histogram<u64>, s: f64) {
    let us = (s * 1e6) as u64;
    let _ = h.record(us.clamp(1, HIST_MAX_US));
}

fn pct(h: &Histogram<u64>) -> (Value, Value, Value) {
    if h.len() == 0 {
        return (Value::Null, Value::Null, Value::Null);
    }
    (
        json!(h.value_at_quantile(0.5) as f64 / 1000.0),
        json!(h.value_at_quantile(0.99) as f64 / 1000.0),
        json!(h.max() as f64 / 1000.0),
    )
}

/// A message's kind (TELEMETRY, EVENT, COMMAND) from the config's `kinds` cycle.
pub fn kind_of(kinds: &[u8], seq: u64, gidx: u64) -> u8 {
    if kinds.is_empty() {
        TELEMETRY
    } else {
        kinds[((seq + gidx) % kinds.len() as u64) as usize]
    }
}

pub fn parse_kinds(kinds: &[String]) -> Result<Vec<u8>, String> {
    kinds
        .iter()
        .map(|k| match k.as_str() {
            "telemetry" => Ok(TELEMETRY),
            "event" => Ok(EVENT),
            "command" => Ok(COMMAND),
            o => Err(format!("kinds: unknown kind {o:?} (use telemetry, event, command)")),
        })
        .collect()
}

/// Where a response's Location-Path says the command is answered (`command_response/<id>` or `cr/<id>`).
pub fn command_response_path(m: &Msg) -> Option<String> {
    let parts: Vec<&[u8]> = m.opt_all(coap::OPT_LOCATION_PATH).collect();
    if parts.len() == 2 && (parts[0] == b"command_response" || parts[0] == b"cr") && !parts[1].is_empty() {
        Some(format!("{}/{}", String::from_utf8_lossy(parts[0]), String::from_utf8_lossy(parts[1])))
    } else {
        None
    }
}

struct Eng {
    cfg: Config,
    poll: Poll,
    devs: Vec<Dev>,
    addr: SocketAddr,
    ctx: SslContext,
    psk_idx: openssl::ex_data::Index<openssl::ssl::Ssl, Psk>,
    kinds: Vec<u8>,
    composer: Composer,
    base: Instant,
    wall_base_ms: f64,
    c: Counts,
    connected: usize,
    inflight: u64,
    hist_sec: Histogram<u64>,
    hist_total: Histogram<u64>,
    late_hist: Histogram<u64>,
    legs: Vec<Leg>,
    errors: BTreeMap<String, u64>,
    csv: Option<BufWriter<File>>,
    pbuf: Vec<u8>,
    rbuf: Vec<u8>,
    late_tol: f64,
    fatal: Option<String>,
    out: io::Stdout,
    writes: u64,
    reads: u64,
    wakeups: u64,
    handshakes_retransmitted: u64,
    retransmits: u64,
    rehandshakes: u64,
    /// handshakes given up after HANDSHAKE_RESTART_S and started again on a new socket
    handshake_restarts: u64,
}

fn want(e: &openssl::ssl::Error) -> bool {
    e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE
}

/// One line for an OpenSSL or socket failure.
fn describe(e: &openssl::ssl::Error) -> String {
    if let Some(io) = e.io_error() {
        return io.to_string();
    }
    if let Some(st) = e.ssl_error() {
        if let Some(first) = st.errors().first() {
            return first.reason().unwrap_or("unknown").to_string();
        }
    }
    format!("{e}")
}

impl Eng {
    #[inline]
    fn now(&self) -> f64 {
        self.base.elapsed().as_secs_f64()
    }

    fn line(&mut self, v: Value) {
        let mut o = self.out.lock();
        let _ = writeln!(o, "{}", v);
        let _ = o.flush();
    }

    fn open(&mut self, li: usize) -> Result<(), String> {
        let d = &mut self.devs[li];
        let local = SocketAddr::new(d.src.unwrap_or(IpAddr::from([127, 0, 0, 1])), 0);
        let mut sock = UdpSocket::bind(local).map_err(|e| format!("bind {local}: {e}"))?;
        sock.connect(self.addr).map_err(|e| format!("connect {}: {e}", self.addr))?;
        self.poll.registry().register(&mut sock, Token(li), Interest::READABLE).map_err(|e| e.to_string())?;
        let mut ssl = dtls::new_ssl(&self.ctx).map_err(|e| format!("DTLS session: {e}"))?;
        ssl.set_ex_data(self.psk_idx, Psk { identity: d.identity.clone(), key: d.key.clone() });
        let stream = SslStream::new(ssl, UdpIo(sock)).map_err(|e| format!("DTLS session: {e}"))?;
        d.stream = Some(stream);
        d.st = St::Handshake;
        d.hs_at = self.base.elapsed().as_secs_f64();
        self.handshake(li);
        Ok(())
    }

    fn handshake(&mut self, li: usize) {
        let d = &mut self.devs[li];
        let Some(s) = d.stream.as_mut() else { return };
        match s.connect() {
            Ok(()) => {
                d.st = St::Up;
                d.was_up = true;
                self.connected += 1;
            }
            Err(e) if want(&e) => {}
            Err(_) if d.was_up => {
                // a re-handshake refused (nothing listens yet, an alert): tried again in RETRY_S, the run goes on
                d.st = St::Down;
                d.retry_at = self.base.elapsed().as_secs_f64() + RETRY_S;
            }
            Err(e) => {
                d.st = St::Down;
                self.fatal = Some(format!(
                    "DTLS handshake of device {} (PSK identity {:?}) with {} failed: {}",
                    d.name,
                    String::from_utf8_lossy(&d.identity),
                    self.addr,
                    describe(&e)
                ));
            }
        }
    }

    fn write_dgram(&mut self, li: usize, dgram: &[u8]) -> Result<(), String> {
        let s = self.devs[li].stream.as_mut().ok_or("no session")?;
        self.writes += 1;
        match s.ssl_write(dgram) {
            Ok(_) => Ok(()),
            Err(e) if want(&e) => Ok(()), // a full socket buffer: the datagram is lost, CoAP retransmits
            Err(e) => Err(describe(&e)),
        }
    }

    /// Start the device's next exchange if it has none: a command response first, then its oldest due message.
    fn pump(&mut self, li: usize, now: f64) {
        if self.devs[li].ex.is_some() || self.devs[li].st != St::Up {
            return;
        }
        let wall_base = self.wall_base_ms;
        let ttd = self.cfg.ttd_s;
        let d = &mut self.devs[li];
        let (leg, seq, intended, ts, path, query): (u8, u64, f64, i64, String, Option<String>);
        self.pbuf.clear();
        if let Some((p, s)) = d.cmd_resp.take() {
            leg = CMD_RESPONSE;
            seq = s;
            intended = now;
            ts = 0;
            path = p;
            query = Some("hono-cmd-status=200".into());
            self.pbuf.extend_from_slice(b"{\"done\": true}");
        } else if let Some(due) = d.queue.pop_front() {
            let kind = kind_of(&self.kinds, due.seq, d.gidx);
            leg = kind;
            seq = due.seq;
            intended = due.intended;
            ts = due.ts;
            let (p, q) = match kind {
                EVENT => ("event", None),
                COMMAND => ("telemetry", Some(format!("hono-ttd={ttd}"))),
                _ => ("telemetry", None),
            };
            path = p.into();
            query = q;
            let sent_ms = (wall_base + now * 1000.0) as i64;
            self.composer.render(&mut self.pbuf, d.gidx, &d.raw, seq, ts, sent_ms);
            if now - intended > self.late_tol {
                self.c.late += 1;
                if due.waited {
                    self.c.held += 1;
                }
            }
            rec(&mut self.late_hist, (now - intended).max(0.0));
        } else {
            return;
        }
        d.mid = d.mid.wrapping_add(1);
        d.tok = d.tok.wrapping_add(1);
        let token = d.tok.to_be_bytes();
        let mut dgram = std::mem::take(&mut d.spare);
        dgram.clear();
        {
            let mut b = Builder::new(&mut dgram, coap::CON, coap::POST, d.mid, &token);
            b.path(coap::OPT_URI_PATH, &path).uint(coap::OPT_CONTENT_FORMAT, 50);
            if let Some(q) = &query {
                b.opt(coap::OPT_URI_QUERY, q.as_bytes());
            }
            b.payload(&self.pbuf);
        }
        let limit = self.cfg.leg_timeout_s + if leg == COMMAND { ttd as f64 } else { 0.0 };
        let ex = Ex {
            leg,
            seq,
            intended,
            ts,
            start: now,
            mid: d.mid,
            token,
            dgram,
            retx_at: now + ACK_TIMEOUT_S,
            retx_n: 0,
            deadline: now + limit,
            got_ack: false,
        };
        self.devs[li].ex = Some(ex);
        self.inflight += 1;
        let dg = std::mem::take(&mut self.devs[li].ex.as_mut().unwrap().dgram);
        let r = self.write_dgram(li, &dg);
        self.devs[li].ex.as_mut().unwrap().dgram = dg;
        if let Err(e) = r {
            self.broken(li, &format!("connection {e}"), now);
        }
    }

    /// An exchange timed out without even a CoAP ACK to any of its retransmissions: the other side may no longer
    /// know the session (a pod killed behind a Service: the new one drops records it cannot authenticate, as DTLS
    /// does). The device drops it and handshakes again on a new socket (a new source port: a new path through the
    /// Service), as a device does when its server stops answering; what comes due meanwhile waits in its queue.
    fn rehandshake(&mut self, li: usize) {
        if self.devs[li].st == St::Up {
            self.connected -= 1;
        }
        self.rehandshakes += 1;
        self.new_session(li);
    }

    /// Drop the device's session and socket, and begin a handshake on a new socket (none to be had: tried again in
    /// RETRY_S, as a refused re-handshake).
    fn new_session(&mut self, li: usize) {
        if let Some(mut s) = self.devs[li].stream.take() {
            let _ = self.poll.registry().deregister(&mut s.get_mut().0);
        }
        if self.open(li).is_err() {
            self.devs[li].st = St::Down;
            self.devs[li].retry_at = self.now() + RETRY_S;
        }
    }

    /// A handshake that did not complete within HANDSHAKE_RESTART_S (a cold server that dropped its first flights,
    /// or lost the handshake's state) starts again from a ClientHello on a new socket, as a device's DTLS stack
    /// does, rather than waiting out OpenSSL's doubling retransmit timer.
    fn restart_handshake(&mut self, li: usize) {
        self.handshake_restarts += 1;
        self.new_session(li);
    }

    /// The session broke (an alert, a refused datagram): the outstanding exchange fails with `cause`; the device
    /// handshakes again in RETRY_S (what comes due meanwhile waits in its queue).
    fn broken(&mut self, li: usize, cause: &str, now: f64) {
        if self.devs[li].st == St::Up {
            self.connected -= 1;
        }
        self.devs[li].st = St::Down;
        self.devs[li].retry_at = now + RETRY_S;
        if self.devs[li].ex.is_some() {
            self.finish(li, None, cause, false, now);
        }
    }

    /// The outstanding exchange ended: `code` = Some(CoAP code) for an answer (with `cmd` its command path), or
    /// None with `cause` (timeout, connection ...).
    fn finish(&mut self, li: usize, code: Option<u8>, cause: &str, cmd: bool, now: f64) -> Option<()> {
        let ex = self.devs[li].ex.take()?;
        self.inflight -= 1;
        self.devs[li].spare = ex.dgram;
        let leg_i = ex.leg as usize;
        let success = code.is_some_and(coap::is_success);
        let label = match code {
            Some(c) => format!("coap {}", coap::dotted(c)),
            None => cause.to_string(),
        };
        let leg = &mut self.legs[leg_i];
        if success && (cmd || ex.leg != COMMAND) {
            leg.ok += 1;
            leg.sec_ok += 1;
            rec(&mut leg.hist_sec, now - ex.start);
        } else {
            let outcome = if success { NO_COMMAND.to_string() } else { label.clone() };
            *leg.sec_codes.entry(outcome.clone()).or_insert(0) += 1;
            *leg.codes.entry(outcome).or_insert(0) += 1;
        }
        if ex.leg != CMD_RESPONSE {
            if success {
                self.c.acked += 1;
                let lat = now - ex.intended;
                rec(&mut self.hist_sec, lat);
                if let Some(w) = self.csv.as_mut() {
                    let acked_ms = (self.wall_base_ms + now * 1000.0) as i64;
                    let _ = writeln!(w, "{},{},{},{}", self.devs[li].name, ex.seq, ex.ts, acked_ms);
                }
            } else {
                self.c.sent -= 1;
                self.c.failed += 1;
                *self.errors.entry(label).or_insert(0) += 1;
            }
        }
        let _ = ex.token;
        Some(())
    }

    fn on_readable(&mut self, li: usize) {
        let now = self.now();
        if self.devs[li].st == St::Handshake {
            self.devs[li].heard = true;
            self.handshake(li);
            if self.devs[li].st != St::Up {
                return;
            }
        }
        loop {
            let Some(s) = self.devs[li].stream.as_mut() else { return };
            let mut buf = std::mem::take(&mut self.rbuf);
            self.reads += 1;
            let r = s.ssl_read(&mut buf);
            match r {
                Ok(n) => {
                    self.response(li, &buf[..n], now);
                    self.rbuf = buf;
                }
                Err(e) if want(&e) => {
                    self.rbuf = buf;
                    break;
                }
                Err(e) => {
                    self.rbuf = buf;
                    let cause = if e.code() == ErrorCode::ZERO_RETURN { "closed".to_string() } else { describe(&e) };
                    self.broken(li, &format!("connection {cause}"), now);
                    return;
                }
            }
        }
        self.pump(li, now);
    }

    fn response(&mut self, li: usize, data: &[u8], now: f64) {
        let Ok(m) = Msg::parse(data) else { return };
        let (mid, token) = match &self.devs[li].ex {
            Some(ex) => (ex.mid, ex.token),
            None => (0, [0; 4]),
        };
        let has_ex = self.devs[li].ex.is_some();
        if m.typ == coap::CON {
            // a separate response (or anything else confirmable): ACK it
            let mut a = Vec::with_capacity(4);
            coap::empty(&mut a, coap::ACK, m.mid);
            let _ = self.write_dgram(li, &a);
        }
        if !has_ex {
            return;
        }
        match m.typ {
            coap::ACK | coap::RST if m.mid != mid => {}
            coap::RST => {
                self.finish(li, None, "coap reset", false, now);
            }
            coap::ACK if m.code == coap::EMPTY => {
                if let Some(ex) = self.devs[li].ex.as_mut() {
                    ex.got_ack = true;
                }
            }
            _ if m.code == coap::EMPTY || m.token != token => {}
            _ => {
                let cmd = command_response_path(&m);
                let leg = self.devs[li].ex.as_ref().map(|e| (e.leg, e.seq));
                let code = m.code;
                if let (Some((COMMAND, seq)), Some(p), true) = (leg, &cmd, coap::is_success(code)) {
                    self.devs[li].cmd_resp = Some((p.clone(), seq));
                }
                self.finish(li, Some(code), "", cmd.is_some(), now);
            }
        }
    }

    fn poll_once(&mut self, events: &mut Events, timeout: f64) {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 0.05));
        self.wakeups += 1;
        if let Err(e) = self.poll.poll(events, Some(t)) {
            if e.kind() != io::ErrorKind::Interrupted {
                self.fatal = Some(format!("poll: {e}"));
            }
            return;
        }
        for ev in events.iter() {
            self.on_readable(ev.token().0);
        }
    }

    /// Timers: DTLS handshake retransmits, CoAP retransmits and exchange deadlines.
    fn timers(&mut self, now: f64) {
        for li in 0..self.devs.len() {
            match self.devs[li].st {
                St::Handshake if now - self.devs[li].hs_at >= HANDSHAKE_RESTART_S => self.restart_handshake(li),
                St::Handshake => {
                    if let Some(s) = self.devs[li].stream.as_ref() {
                        if dtls::timeout(s.ssl()).is_some_and(|t| t.is_zero()) && dtls::handle_timeout(s.ssl()) > 0 {
                            self.handshakes_retransmitted += 1;
                        }
                    }
                }
                St::Up => {
                    let Some(ex) = self.devs[li].ex.as_mut() else { continue };
                    if now >= ex.deadline {
                        let silent = !ex.got_ack;
                        self.finish(li, None, "timeout", false, now);
                        if silent {
                            self.rehandshake(li);
                        } else {
                            self.pump(li, now);
                        }
                    } else if !ex.got_ack && now >= ex.retx_at && ex.retx_n < MAX_RETRANSMIT {
                        ex.retx_n += 1;
                        ex.retx_at = now + ACK_TIMEOUT_S * (1u32 << ex.retx_n) as f64;
                        let dg = std::mem::take(&mut ex.dgram);
                        self.retransmits += 1;
                        let r = self.write_dgram(li, &dg);
                        if let Some(ex) = self.devs[li].ex.as_mut() {
                            ex.dgram = dg;
                        }
                        if let Err(e) = r {
                            self.broken(li, &format!("connection {e}"), now);
                        }
                    }
                }
                St::Down if self.devs[li].retry_at > 0.0 && now >= self.devs[li].retry_at => {
                    self.devs[li].retry_at = 0.0;
                    if self.devs[li].was_up {
                        self.rehandshake(li);
                    } else {
                        self.restart_handshake(li); // (its first handshake found no socket)
                    }
                }
                _ => {}
            }
        }
    }

    /// A due message of device `li`: queued behind its outstanding exchange (NSTART = 1), or failed if down.
    fn due(&mut self, li: usize, intended: f64, now: f64) -> bool {
        let wall_base = self.wall_base_ms;
        let d = &mut self.devs[li];
        if d.st != St::Up && !d.was_up {
            return false;
        }
        let seq = d.next_seq;
        d.next_seq += 1;
        let mut ts = (wall_base + intended * 1000.0) as i64;
        if ts <= d.last_ts {
            ts = d.last_ts + 1;
        }
        d.last_ts = ts;
        let waited = d.ex.is_some() || d.cmd_resp.is_some() || !d.queue.is_empty();
        d.queue.push_back(Due { seq, intended, ts, waited });
        self.pump(li, now);
        true
    }
}

pub fn run_totals(mut cfg: Config, shard: (usize, usize), ctl: Control) -> Result<(i32, Option<Value>), String> {
    raise_nofile_pub();
    let kinds = parse_kinds(&cfg.kinds)?;
    if !(cfg.leg_timeout_s > 0.0) {
        return Err(format!("leg_timeout_s must be > 0, got {}", cfg.leg_timeout_s));
    }
    let Shard { all, lo, hi, addr, srcs } = Shard::of(&mut cfg, shard)?;
    let (si, sn) = shard;
    let composer = Composer::new(&cfg.payload)?;
    let plans = plan(&cfg.segments)?;
    let mut sched = ShardSchedule::new(plans, all.len() as u64, lo as u64, hi as u64);
    let mut devs = Vec::with_capacity(hi - lo);
    for (g, d) in all.iter().enumerate().take(hi).skip(lo) {
        if d.token.is_empty() {
            return Err(format!("device {}: no token (its PSK identity)", d.name));
        }
        devs.push(Dev {
            gidx: g as u64,
            name: d.name.clone(),
            raw: json_escape(&d.name).into_bytes(),
            identity: d.token.as_bytes().to_vec(),
            key: dtls::psk_key(d.password.as_deref().unwrap_or("")),
            src: if srcs.is_empty() { None } else { Some(srcs[g % srcs.len()]) },
            stream: None,
            st: St::Idle,
            next_seq: 0,
            last_ts: -1,
            queue: VecDeque::new(),
            ex: None,
            cmd_resp: None,
            mid: (g as u16).wrapping_mul(7919),
            tok: (g as u32).wrapping_mul(2_654_435_761),
            spare: Vec::new(),
            heard: false,
            was_up: false,
            retry_at: 0.0,
            hs_at: 0.0,
        });
    }
    drop(all);
    let csv = match &cfg.acked_path {
        None => None,
        Some(p) => {
            let p = p.replace("{shard}", &si.to_string());
            if let Some(parent) = std::path::Path::new(&p).parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let mut w = BufWriter::with_capacity(1 << 20, File::create(&p).map_err(|e| format!("acked CSV {p}: {e}"))?);
            let _ = w.write_all(b"device,seq,intended_ms,acked_ms\n");
            let _ = w.flush();
            Some(w)
        }
    };
    let (ctx, psk_idx) = dtls::client_context().map_err(|e| format!("DTLS context: {e}"))?;
    let n_local = devs.len();
    let mut g = Eng {
        poll: Poll::new().map_err(|e| e.to_string())?,
        devs,
        addr,
        ctx,
        psk_idx,
        kinds,
        composer,
        base: Instant::now(),
        wall_base_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0,
        c: Counts::default(),
        connected: 0,
        inflight: 0,
        hist_sec: new_hist(),
        hist_total: new_hist(),
        late_hist: new_hist(),
        legs: (0..4)
            .map(|_| Leg { ok: 0, codes: BTreeMap::new(), hist: new_hist(), sec_ok: 0, sec_codes: BTreeMap::new(), hist_sec: new_hist() })
            .collect(),
        errors: BTreeMap::new(),
        csv,
        pbuf: Vec::with_capacity(2048),
        rbuf: vec![0u8; 65536],
        late_tol: cfg.late_tolerance_ms / 1000.0,
        fatal: None,
        out: io::stdout(),
        writes: 0,
        reads: 0,
        wakeups: 0,
        handshakes_retransmitted: 0,
        rehandshakes: 0,
        handshake_restarts: 0,
        retransmits: 0,
        cfg,
    };
    let mut events = Events::with_capacity(4096);
    let stop = ctl.stop.clone();

    // ---- handshakes
    let c0 = g.now();
    let mut opened = 0usize;
    let mut next_timers = c0 + 0.05;
    while g.connected < n_local {
        let now = g.now();
        if stop.load(Ordering::Relaxed) {
            g.line(json!({"event": "stopped", "connected": g.connected, "devices": n_local}));
            return Ok((4, None));
        }
        if let Some(f) = g.fatal.take() {
            g.line(json!({"error": f, "connected": g.connected}));
            return Ok((3, None));
        }
        if now - c0 > g.cfg.connect_timeout_s {
            let missing = n_local - g.connected;
            let msg = match g.devs.iter().find(|d| d.st != St::Up && d.heard) {
                // DTLS drops a record it cannot authenticate: a wrong key shows as a handshake that never ends
                Some(d) => format!("DTLS handshake of device {} (PSK identity {:?}) with {} did not complete within {}s although \
                    the endpoint answered: wrong pre-shared key? ({missing} of {n_local} devices without a session)",
                    d.name, String::from_utf8_lossy(&d.identity), g.addr, g.cfg.connect_timeout_s),
                None => format!("{missing} of {n_local} devices without a DTLS session after {}s: no handshake answer from {} \
                    (no DTLS endpoint there?)", g.cfg.connect_timeout_s, g.addr),
            };
            g.line(json!({"error": msg, "connected": g.connected}));
            return Ok((3, None));
        }
        let allowed = if g.cfg.connect_rate > 0.0 { (((now - c0) * g.cfg.connect_rate) as usize + 1).min(n_local) } else { n_local };
        let pending = opened - g.connected;
        let mut room = g.cfg.max_pending_connects.max(1).saturating_sub(pending);
        while opened < allowed && room > 0 {
            if let Err(e) = g.open(opened) {
                g.line(json!({"error": format!("device {}: {e}", g.devs[opened].name), "connected": g.connected}));
                return Ok((3, None));
            }
            opened += 1;
            room -= 1;
        }
        g.poll_once(&mut events, 0.005);
        let now = g.now();
        if now >= next_timers {
            g.timers(now);
            next_timers = now + 0.05;
        }
    }
    let connect_s = g.now() - c0;
    g.line(json!({"event": "connected", "connected": g.connected, "devices": n_local,
                  "shard": [si, sn], "range": [lo, hi], "connect_s": connect_s,
                  "handshake_restarts": g.handshake_restarts}));

    // ---- wait for the start
    loop {
        if stop.load(Ordering::Relaxed) || !ctl.wait_start || ctl.start_ms.load(Ordering::Relaxed) != 0 {
            break;
        }
        g.poll_once(&mut events, 0.02);
    }
    let mut start_ms = ctl.start_ms.load(Ordering::Relaxed);
    if start_ms <= 0 {
        start_ms = g.cfg.start_at_unix_ms.unwrap_or(0);
    }
    let mut t0 = g.now();
    if start_ms > 0 {
        let delta = (start_ms as f64 - (g.wall_base_ms + g.now() * 1000.0)) / 1000.0;
        if delta > 0.0 && delta < 60.0 {
            t0 += delta;
        }
    }
    while g.now() < t0 && !stop.load(Ordering::Relaxed) {
        let w = t0 - g.now();
        g.poll_once(&mut events, w);
    }

    // ---- load
    let mut sec: u64 = 0;
    let mut next_sec_at = t0 + 1.0;
    let mut prev = Counts::default();
    let mut prev_cpu = (cpu_s(), (0u64, 0u64, 0u64));
    let cpu_load0 = prev_cpu.0;
    let mut next = sched.next();
    let sched_end = t0 + sched.end();
    let emit = |g: &mut Eng, s: u64, prev: &mut Counts, prev_cpu: &mut (f64, (u64, u64, u64)), sched: &ShardSchedule| {
        let cur = g.c;
        let io = (g.writes, g.reads, g.wakeups);
        let cpu = cpu_s();
        let (p50, p99, mx) = pct(&g.hist_sec);
        let hist = if g.cfg.hist && g.hist_sec.len() > 0 { json!(encode_hist(&g.hist_sec)) } else { Value::Null };
        if g.hist_sec.len() > 0 {
            let _ = g.hist_total.add(&g.hist_sec);
            g.hist_sec.reset();
        }
        if let Some(w) = g.csv.as_mut() {
            let _ = w.flush();
        }
        // each leg's second: {ok, codes (outcomes other than ok), hist (round trips)}, legs without any left out
        let mut legs = Map::new();
        for (i, name) in LEGS.iter().enumerate() {
            let l = &mut g.legs[i];
            if l.sec_ok == 0 && l.sec_codes.is_empty() {
                continue;
            }
            let h = if l.hist_sec.len() > 0 { json!(encode_hist(&l.hist_sec)) } else { Value::Null };
            legs.insert(name.to_string(), json!({"ok": l.sec_ok, "codes": l.sec_codes, "hist": h}));
            let _ = l.hist.add(&l.hist_sec);
            l.hist_sec.reset();
            l.sec_ok = 0;
            l.sec_codes.clear();
        }
        let v = json!({
            "t": s, "target_rate": sched.rate_at(s as f64),
            "scheduled": cur.scheduled - prev.scheduled, "sent": cur.sent - prev.sent,
            "acked": cur.acked - prev.acked, "failed": cur.failed - prev.failed,
            "late": cur.late - prev.late, "held": cur.held - prev.held, "dropped": cur.dropped - prev.dropped,
            "connected": g.connected, "inflight": g.inflight,
            "p50_ms": p50, "p99_ms": p99, "max_ms": mx, "hist": hist,
            "cpu_s": ((cpu - prev_cpu.0) * 1e6).round() / 1e6,
            "writes": io.0 - prev_cpu.1 .0, "reads": io.1 - prev_cpu.1 .1, "wakeups": io.2 - prev_cpu.1 .2,
            "legs": legs,
        });
        *prev = cur;
        *prev_cpu = (cpu, io);
        g.line(v);
    };
    // the per-second lines and the retransmission timers, in the load loop and in the drain alike
    macro_rules! housekeep {
        ($now:expr) => {
            while $now >= next_sec_at {
                emit(&mut g, sec, &mut prev, &mut prev_cpu, &sched);
                sec += 1;
                next_sec_at = t0 + sec as f64 + 1.0;
            }
            if $now >= next_timers {
                g.timers($now);
                next_timers = $now + 0.05;
            }
        };
    }
    let mut stopped = false;
    loop {
        let now = g.now();
        if stop.load(Ordering::Relaxed) {
            while let Some((_, _, t)) = next {
                if t0 + t > now {
                    break;
                }
                g.c.scheduled += 1;
                g.c.dropped += 1;
                next = sched.next();
            }
            stopped = true;
            break;
        }
        housekeep!(now);
        let mut n = 0;
        while let Some((_, dev, t)) = next {
            let intended = t0 + t;
            if intended > now || n >= 20_000 {
                break;
            }
            g.c.scheduled += 1;
            if g.due(dev as usize - lo, intended, now) {
                g.c.sent += 1;
            } else {
                g.c.failed += 1;
                *g.errors.entry("not connected".into()).or_insert(0) += 1;
            }
            n += 1;
            next = sched.next();
        }
        let due = match next {
            Some((_, _, t)) => t0 + t,
            None if now >= sched_end => break,
            None => sched_end,
        };
        let wake = due.min(next_sec_at).min(next_timers);
        let timeout = if n >= 20_000 { 0.0 } else { wake - g.now() };
        g.poll_once(&mut events, timeout);
    }
    // ---- drain: every queued and outstanding exchange answered, or the drain timeout
    let deadline = g.now() + g.cfg.drain_timeout_s;
    let busy = |g: &Eng| g.inflight > 0 || g.devs.iter().any(|d| !d.queue.is_empty() || d.cmd_resp.is_some());
    while !stopped && busy(&g) {
        let now = g.now();
        if now >= deadline {
            break;
        }
        housekeep!(now);
        let w = deadline.min(next_sec_at).min(next_timers) - g.now();
        g.poll_once(&mut events, w);
    }
    let now = g.now();
    while now >= next_sec_at {
        emit(&mut g, sec, &mut prev, &mut prev_cpu, &sched);
        sec += 1;
        next_sec_at = t0 + sec as f64 + 1.0;
    }
    emit(&mut g, sec, &mut prev, &mut prev_cpu, &sched);
    let elapsed = g.now() - t0;
    if let Some(w) = g.csv.as_mut() {
        let _ = w.flush();
    }
    let (p50, p99, mx) = pct(&g.hist_total);
    let mut last_seq = Map::new();
    for d in &g.devs {
        last_seq.insert(d.name.clone(), json!(d.next_seq as i64 - 1));
    }
    let late_p99 = if g.late_hist.len() > 0 { json!(g.late_hist.value_at_quantile(0.99) as f64 / 1000.0) } else { Value::Null };
    let late_max = if g.late_hist.len() > 0 { json!(g.late_hist.max() as f64 / 1000.0) } else { Value::Null };
    let mut legs = Map::new();
    for (i, name) in LEGS.iter().enumerate() {
        let l = &g.legs[i];
        let (p50, p99, mx) = pct(&l.hist);
        legs.insert(name.to_string(), json!({"ok": l.ok, "codes": l.codes, "p50_ms": p50, "p99_ms": p99, "max_ms": mx,
            "hist": if l.hist.len() > 0 { json!(encode_hist(&l.hist)) } else { Value::Null }}));
    }
    let c = g.c;
    let totals = json!({"totals": {
        "scheduled": c.scheduled, "sent": c.sent, "acked": c.acked, "failed": c.failed,
        "late": c.late, "held": c.held, "dropped": c.dropped, "unacked": c.sent - c.acked,
        "last_seq": last_seq, "p50_ms": p50, "p99_ms": p99, "max_ms": mx,
        "reconnects": g.rehandshakes, "elapsed_s": elapsed, "lost_in_flight": 0,
        "send_late_p99_ms": late_p99, "send_late_max_ms": late_max,
        "hist": if g.hist_total.len() > 0 { json!(encode_hist(&g.hist_total)) } else { Value::Null },
        "send_late_hist": if g.late_hist.len() > 0 { json!(encode_hist(&g.late_hist)) } else { Value::Null },
        "shard": [si, sn], "range": [lo, hi],
        "cpu_s": cpu_s() - cpu_load0, "writes": g.writes, "reads": g.reads, "wakeups": g.wakeups,
        "errors": g.errors, "legs": legs, "coap_retransmits": g.retransmits,
        "dtls_handshake_retransmits": g.handshakes_retransmitted, "dtls_handshake_restarts": g.handshake_restarts,
    }});
    g.line(totals.clone());
    // ---- close_notify to every session
    for d in g.devs.iter_mut() {
        if let Some(s) = d.stream.as_mut() {
            if d.st == St::Up {
                let _ = s.shutdown();
            }
        }
    }
    Ok((0, Some(totals)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_cycle_by_seq_and_device() {
        let k = parse_kinds(&["telemetry".into(), "event".into(), "command".into()]).unwrap();
        assert_eq!(kind_of(&k, 0, 0), TELEMETRY);
        assert_eq!(kind_of(&k, 1, 0), EVENT);
        assert_eq!(kind_of(&k, 0, 2), COMMAND);
        assert_eq!(kind_of(&k, 3, 1), EVENT);
        assert_eq!(kind_of(&[], 5, 5), TELEMETRY);
        assert!(parse_kinds(&["cmd".into()]).unwrap_err().contains("unknown kind \"cmd\""));
    }

    #[test]
    fn command_location() {
        let mut b = Vec::new();
        Builder::new(&mut b, coap::ACK, coap::CHANGED, 1, &[9])
            .opt(coap::OPT_LOCATION_PATH, b"command_response")
            .opt(coap::OPT_LOCATION_PATH, b"abc");
        assert_eq!(command_response_path(&Msg::parse(&b).unwrap()).as_deref(), Some("command_response/abc"));
        let mut b = Vec::new();
        Builder::new(&mut b, coap::ACK, coap::CHANGED, 1, &[9]).opt(coap::OPT_LOCATION_PATH, b"command");
        assert_eq!(command_response_path(&Msg::parse(&b).unwrap()), None);
        let mut b = Vec::new();
        Builder::new(&mut b, coap::ACK, coap::CHANGED, 1, &[9]);
        assert_eq!(command_response_path(&Msg::parse(&b).unwrap()), None);
    }
}
