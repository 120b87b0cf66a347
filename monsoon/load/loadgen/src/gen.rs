//! `monsoon-loadgen run`: an open-model MQTT 3.1.1 fleet, one device = one connection,
//! all driven by one mio (epoll) loop on one thread. See `main.rs` for the contract.
use crate::mqtt;
use crate::payload::{json_escape, Composer, LastNum, PayloadSpec, Stamps};
use crate::schedule::{plan, ShardSchedule};
use base64::Engine;
use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const HIST_MAX_US: u64 = 3_600_000_000;

fn d_host() -> String { "127.0.0.1".into() }
fn d_qos() -> u8 { 1 }
fn d_topic() -> String { "v1/devices/me/telemetry".into() }
fn d_late() -> f64 { 50.0 }
fn d_keepalive() -> u16 { 15 }
fn d_drain() -> f64 { 5.0 }
fn d_ctimeout() -> f64 { 30.0 }
fn d_pending() -> usize { 512 }
fn d_batch() -> f64 { 5.0 }
fn d_transport() -> String { "mqtt".into() }
fn d_ttd() -> u32 { 5 }
fn d_leg_timeout() -> f64 { 10.0 }

#[derive(Deserialize, Debug, Clone)]
pub struct DeviceSpec {
    pub name: String,
    #[serde(default)]
    pub token: String,
    /// the MQTT password sent with the token, where the platform wants one (Hono); the JSON list only
    #[serde(default)]
    pub password: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Devices {
    List(Vec<DeviceSpec>),
    Csv(String),
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "d_host")]
    pub host: String,
    pub port: u16,
    #[serde(default = "d_qos")]
    pub qos: u8,
    #[serde(default = "d_topic")]
    pub topic: String,
    #[serde(default)]
    pub client_id_prefix: String,
    pub devices: Devices,
    pub segments: Vec<[f64; 3]>,
    #[serde(default = "d_late")]
    pub late_tolerance_ms: f64,
    #[serde(default)]
    pub payload: PayloadSpec,
    #[serde(default)]
    pub acked_path: Option<String>,
    #[serde(default)]
    pub source_addrs: Vec<String>,
    /// new connections per second (0 = as fast as possible)
    #[serde(default)]
    pub connect_rate: f64,
    /// connections awaiting their CONNACK at once
    #[serde(default = "d_pending")]
    pub max_pending_connects: usize,
    #[serde(default = "d_keepalive")]
    pub keepalive_s: u16,
    #[serde(default = "d_drain")]
    pub drain_timeout_s: f64,
    #[serde(default = "d_ctimeout")]
    pub connect_timeout_s: f64,
    /// add each second's latency histogram (HdrHistogram V2 compressed, base64) to its line
    #[serde(default)]
    pub hist: bool,
    /// start the load at this wall-clock time (ms since the epoch) instead of right away
    #[serde(default)]
    pub start_at_unix_ms: Option<i64>,
    /// due messages are composed and written at most once per this many ms (0 = at every
    /// wake-up): one write per connection per tick carries all its due publishes, so CPU per
    /// message falls with the batch while each message leaves at most one tick after its time
    #[serde(default = "d_batch")]
    pub batch_ms: f64,
    /// `mqtt` (this module) or `hono-coap` (CoAP over DTLS with PSK, Hono's CoAP adapter: `honocoap`)
    #[serde(default = "d_transport")]
    pub transport: String,
    /// hono-coap: the kinds of consecutive messages (`monsoon.load.hono.leg_cycle`); empty = all telemetry
    #[serde(default)]
    pub kinds: Vec<String>,
    /// hono-coap: the hono-ttd of a command query (s)
    #[serde(default = "d_ttd")]
    pub ttd_s: u32,
    /// hono-coap: how long one request waits for its answer (s; a command query: this + ttd_s)
    #[serde(default = "d_leg_timeout")]
    pub leg_timeout_s: f64,
}

pub fn load_devices(d: &Devices) -> Result<Vec<DeviceSpec>, String> {
    match d {
        Devices::List(v) => Ok(v.clone()),
        Devices::Csv(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("devices CSV {path}: {e}"))?;
            let mut out = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || (i == 0 && line.starts_with("name")) {
                    continue;
                }
                let mut it = line.splitn(2, ',');
                let name = it.next().unwrap().trim().to_string();
                let token = it.next().unwrap_or("").trim().to_string();
                out.push(DeviceSpec { name, token, password: None });
            }
            Ok(out)
        }
    }
}

/// Device index range of shard i of n: [i*D/n, (i+1)*D/n).
pub fn shard_range(d: usize, i: usize, n: usize) -> (usize, usize) {
    (i * d / n, (i + 1) * d / n)
}

#[derive(PartialEq, Clone, Copy, Debug)]
enum St {
    Idle,
    Connecting,
    WaitConnack,
    Up,
    Down,
}

struct Pending {
    mid: u16,
    seq: u64,
    intended: f64,
    ts: i64,
}

/// The fewest slots [`trim`] leaves a queue.
const TRIM_MIN: usize = 64;

/// A per-connection queue's memory back towards what it holds. Its capacity follows a latency spike up (one slot
/// per message in flight or unwritten) and would otherwise keep that high-water mark for the rest of the run: in a
/// 72-minute day at 200,000 msg/s the worker's RSS rose in steps at the worst ack latencies. Shrinks to twice the
/// length when the queue uses less than an eighth of its capacity, so a queue that refills reallocates rarely.
#[inline]
fn trim<T>(q: &mut VecDeque<T>) {
    let cap = q.capacity();
    if cap > TRIM_MIN && q.len() < cap / 8 {
        q.shrink_to((q.len() * 2).max(TRIM_MIN));
    }
}

struct Conn {
    gidx: u64,
    name: String,
    raw: Vec<u8>,
    client_id: String,
    token: String,
    password: Option<String>,
    src: Option<IpAddr>,
    stream: Option<TcpStream>,
    st: St,
    wbuf: Vec<u8>,
    wpos: usize,
    rleft: Vec<u8>,
    dirty: bool,
    next_seq: u64,
    last_ts: i64,
    next_mid: u16,
    pending: VecDeque<Pending>,
    /// publishes not yet fully written to the socket: (end as a byte count, intended time)
    unwritten: VecDeque<(u64, f64)>,
    /// bytes appended to / written from wbuf since the connection opened
    wtotal: u64,
    wdone: u64,
    retry_at: f64,
    backoff: f64,
    last_tx: f64,
}

/// The engine's own syscall counters (what the CPU per message is made of).
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub struct Io {
    pub writes: u64,
    pub reads: u64,
    pub wakeups: u64,
}

/// CPU seconds (user + system) this process has used so far (getrusage; one call per second).
pub fn cpu_s() -> f64 {
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut r) != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(r.ru_utime) + tv(r.ru_stime)
    }
}

#[derive(Default, Clone, Copy)]
struct Counts {
    scheduled: u64,
    sent: u64,
    acked: u64,
    failed: u64,
    late: u64,
    dropped: u64,
}

pub struct Control {
    pub stop: Arc<AtomicBool>,
    /// 0 = not yet; otherwise the start time, ms since the epoch (or -1 = now)
    pub start_ms: Arc<AtomicI64>,
    pub wait_start: bool,
}

struct Gen {
    cfg: Config,
    poll: Poll,
    conns: Vec<Conn>,
    addr: SocketAddr,
    topic16: Vec<u8>,
    composer: Composer,
    base: Instant,
    wall_base_ms: f64,
    c: Counts,
    connected: usize,
    inflight: u64,
    reconnects: u64,
    lost_in_flight: u64,
    hist_sec: Histogram<u64>,
    hist_total: Histogram<u64>,
    late_hist: Histogram<u64>,
    csv: Option<BufWriter<File>>,
    scratch: Vec<u8>,
    /// the digits of the last payload timestamps, and of the acked record's last intended and acked times
    stamps: Stamps,
    csv_ts: LastNum,
    csv_acked: LastNum,
    dirty: Vec<usize>,
    fatal: Option<String>,
    last_error: Option<String>,
    in_connect_phase: bool,
    late_tol: f64,
    out: io::Stdout,
    io: Io,
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 2).unwrap()
}

pub fn encode_hist(h: &Histogram<u64>) -> String {
    let mut buf = Vec::new();
    V2DeflateSerializer::new().serialize(h, &mut buf).unwrap();
    base64::engine::general_purpose::STANDARD.encode(&buf)
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

/// What every engine (MQTT, Hono's CoAP) takes from its config before it opens a socket: the device list (only
/// this shard's part is used; the config's copy is freed, since 250,000 devices over 13 workers would otherwise be
/// held 13 times), the shard's range of it, the endpoint's IPv4 address, the source addresses, and a check that
/// the open-file limit holds a socket per device.
pub(crate) struct Shard {
    pub all: Vec<DeviceSpec>,
    pub lo: usize,
    pub hi: usize,
    pub addr: SocketAddr,
    pub srcs: Vec<IpAddr>,
}

impl Shard {
    pub(crate) fn of(cfg: &mut Config, shard: (usize, usize)) -> Result<Shard, String> {
        let all = load_devices(&cfg.devices)?;
        cfg.devices = Devices::List(Vec::new());
        if all.is_empty() {
            return Err("no devices".into());
        }
        let (si, sn) = shard;
        if sn == 0 || si >= sn {
            return Err(format!("bad shard {si}/{sn}"));
        }
        let (lo, hi) = shard_range(all.len(), si, sn);
        let addr = (cfg.host.as_str(), cfg.port)
            .to_socket_addrs()
            .map_err(|e| format!("{}:{}: {e}", cfg.host, cfg.port))?
            .find(|a| a.is_ipv4())
            .ok_or_else(|| format!("{}: no IPv4 address", cfg.host))?;
        let srcs: Vec<IpAddr> = cfg
            .source_addrs
            .iter()
            .map(|s| s.parse::<IpAddr>().map_err(|e| format!("source address {s:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let need = (hi - lo) as u64 + 64;
        if nofile_limit() < need {
            return Err(format!(
                "shard has {} devices but the open-file limit is {} (hard limit reached): use more shards/workers",
                hi - lo,
                nofile_limit()
            ));
        }
        Ok(Shard { all, lo, hi, addr, srcs })
    }
}

pub fn raise_nofile_pub() {
    raise_nofile()
}

fn raise_nofile() {
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

pub fn nofile_limit() -> u64 {
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur as u64
    }
}

impl Gen {
    #[inline]
    fn now(&self) -> f64 {
        self.base.elapsed().as_secs_f64()
    }

    fn line(&mut self, v: Value) {
        let mut o = self.out.lock();
        let _ = writeln!(o, "{}", v);
        let _ = o.flush();
    }

    fn open(&mut self, li: usize) {
        let now = self.now();
        let c = &mut self.conns[li];
        let r = (|| -> io::Result<TcpStream> {
            let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
            sock.set_nonblocking(true)?;
            sock.set_nodelay(true)?;
            if let Some(src) = c.src {
                unsafe {
                    let one: libc::c_int = 1;
                    libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&sock),
                        libc::IPPROTO_IP,
                        libc::IP_BIND_ADDRESS_NO_PORT,
                        &one as *const _ as *const libc::c_void,
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    );
                }
                sock.bind(&SocketAddr::new(src, 0).into())?;
            }
            match sock.connect(&self.addr.into()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
                Err(e) => return Err(e),
            }
            let std: std::net::TcpStream = sock.into();
            Ok(TcpStream::from_std(std))
        })();
        match r {
            Ok(mut s) => {
                if let Err(e) = self.poll.registry().register(&mut s, Token(li), Interest::READABLE | Interest::WRITABLE) {
                    self.last_error = Some(format!("register: {e}"));
                    c.st = St::Down;
                    c.retry_at = now + c.backoff;
                    return;
                }
                c.stream = Some(s);
                c.st = St::Connecting;
                c.wbuf.clear();
                c.wpos = 0;
                c.rleft.clear();
                c.unwritten.clear();
                mqtt::connect(&mut c.wbuf, &c.client_id, &c.token, c.password.as_deref(), self.cfg.keepalive_s);
                c.wtotal = c.wbuf.len() as u64;
                c.wdone = 0;
                c.last_tx = now;
            }
            Err(e) => {
                let msg = format!("device {}: cannot connect to {}: {}", c.name, self.addr, e);
                if e.kind() == io::ErrorKind::ConnectionRefused && self.in_connect_phase {
                    self.fatal = Some(msg.clone());
                }
                self.last_error = Some(msg);
                c.st = St::Down;
                c.retry_at = now + c.backoff;
                c.backoff = (c.backoff * 2.0).min(2.0);
            }
        }
    }

    fn drop_conn(&mut self, li: usize, why: String) {
        let now = self.now();
        let c = &mut self.conns[li];
        if let Some(mut s) = c.stream.take() {
            let _ = self.poll.registry().deregister(&mut s);
        }
        if c.st == St::Up {
            self.connected -= 1;
        }
        let lost = c.pending.len() as u64;
        c.pending.clear();
        self.inflight -= lost;
        self.lost_in_flight += lost;
        if self.in_connect_phase && (c.st == St::Connecting || c.st == St::WaitConnack) && why.contains("refused") {
            self.fatal = Some(format!("device {}: {}", c.name, why));
        }
        self.last_error = Some(format!("device {}: {}", c.name, why));
        c.st = St::Down;
        c.wbuf.clear();
        c.wpos = 0;
        c.rleft.clear();
        c.unwritten.clear();
        c.dirty = false;
        c.retry_at = now + c.backoff;
        c.backoff = (c.backoff * 2.0).min(2.0);
    }

    fn flush(&mut self, li: usize) {
        let c = &mut self.conns[li];
        c.dirty = false;
        if c.st == St::Connecting {
            return;
        }
        let Some(s) = c.stream.as_mut() else { return };
        let mut err = None;
        while c.wpos < c.wbuf.len() {
            self.io.writes += 1;
            match s.write(&c.wbuf[c.wpos..]) {
                Ok(0) => {
                    err = Some("write returned 0".to_string());
                    break;
                }
                Ok(n) => {
                    c.wpos += n;
                    c.wdone += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    err = Some(format!("write: {e}"));
                    break;
                }
            }
        }
        if !c.unwritten.is_empty() {
            // messages whose last byte the kernel took: they left now; late if past tolerance
            let now = self.base.elapsed().as_secs_f64();
            while let Some(&(end, intended)) = c.unwritten.front() {
                if end > c.wdone {
                    break;
                }
                c.unwritten.pop_front();
                let late_s = now - intended;
                self.late_hist.saturating_record(((late_s * 1e6) as i64).clamp(1, HIST_MAX_US as i64) as u64);
                if late_s > self.late_tol {
                    self.c.late += 1;
                }
            }
            trim(&mut c.unwritten);
        }
        if c.wpos >= c.wbuf.len() {
            c.wbuf.clear();
            c.wpos = 0;
            if c.wbuf.capacity() > (1 << 20) {
                c.wbuf.shrink_to(4096);
            }
        } else if c.wpos > (1 << 20) {
            c.wbuf.drain(..c.wpos);
            c.wpos = 0;
        }
        if let Some(e) = err {
            self.drop_conn(li, e);
        }
    }

    fn mark_dirty(&mut self, li: usize) {
        let c = &mut self.conns[li];
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(li);
        }
    }

    fn flush_dirty(&mut self) {
        let d = std::mem::take(&mut self.dirty);
        for &li in &d {
            if self.conns[li].dirty {
                self.flush(li);
            }
        }
        let mut d = d;
        d.clear();
        self.dirty = d;
    }

    fn on_event(&mut self, li: usize, readable: bool, writable: bool, error: bool) {
        if li >= self.conns.len() || self.conns[li].stream.is_none() {
            return;
        }
        if self.conns[li].st == St::Connecting {
            let s = self.conns[li].stream.as_ref().unwrap();
            match s.take_error() {
                Ok(Some(e)) | Err(e) => {
                    let why = if e.kind() == io::ErrorKind::ConnectionRefused {
                        "nothing listening (connection refused)".to_string()
                    } else {
                        format!("connect: {e}")
                    };
                    self.drop_conn(li, why);
                    return;
                }
                Ok(None) => {}
            }
            match s.peer_addr() {
                Ok(_) => {
                    self.conns[li].st = St::WaitConnack;
                    self.flush(li);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                    if error {
                        self.drop_conn(li, "connect failed".into());
                    }
                    return;
                }
                Err(e) => {
                    self.drop_conn(li, format!("connect: {e}"));
                    return;
                }
            }
        }
        if writable && self.conns[li].wpos < self.conns[li].wbuf.len() {
            self.flush(li);
        }
        if readable || error {
            self.read(li);
        }
    }

    fn read(&mut self, li: usize) {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut closed: Option<String> = None;
        loop {
            let Some(s) = self.conns[li].stream.as_mut() else { break };
            self.io.reads += 1;
            match s.read(&mut scratch) {
                Ok(0) => {
                    closed = Some("connection closed by the broker".into());
                    break;
                }
                Ok(n) => {
                    if let Err(e) = self.process(li, &scratch[..n]) {
                        closed = Some(e);
                        break;
                    }
                    if n < scratch.len() {
                        break; // drained (edge-triggered: a later arrival raises a new event)
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let why = if e.kind() == io::ErrorKind::ConnectionRefused {
                        "nothing listening (connection refused)".to_string()
                    } else {
                        format!("read: {e}")
                    };
                    closed = Some(why);
                    break;
                }
            }
        }
        self.scratch = scratch;
        if let Some(why) = closed {
            self.drop_conn(li, why);
        }
    }

    fn process(&mut self, li: usize, data: &[u8]) -> Result<(), String> {
        let mut left = std::mem::take(&mut self.conns[li].rleft);
        let buf: &[u8] = if left.is_empty() {
            data
        } else {
            left.extend_from_slice(data);
            &left
        };
        let mut pos = 0;
        let now = self.now();
        let mut r = Ok(());
        while pos < buf.len() {
            // the hot case, a whole PUBACK (4 bytes), without the general framing below
            if buf[pos] == mqtt::PUBACK && buf.len() - pos >= 4 && buf[pos + 1] == 2 {
                self.on_ack(li, u16::from_be_bytes([buf[pos + 2], buf[pos + 3]]), now);
                pos += 4;
                continue;
            }
            match mqtt::frame(&buf[pos..]) {
                Err(()) => {
                    r = Err("malformed packet from the broker".to_string());
                    break;
                }
                Ok(None) => break,
                Ok(Some((h, b, end))) => {
                    let body = &buf[pos + b..pos + end];
                    match h & 0xF0 {
                        mqtt::PUBACK if body.len() >= 2 => {
                            self.on_ack(li, u16::from_be_bytes([body[0], body[1]]), now)
                        }
                        mqtt::CONNACK if body.len() >= 2 => {
                            let c = &mut self.conns[li];
                            if body[1] == 0 {
                                if c.st != St::Up {
                                    c.st = St::Up;
                                    self.connected += 1;
                                }
                                c.backoff = 0.2;
                            } else {
                                let why = format!("CONNACK refused (return code {}: {})", body[1], mqtt::connack_reason(body[1]));
                                if self.in_connect_phase {
                                    self.fatal = Some(format!("broker {} refused device {}: {}", self.addr, c.name, why));
                                }
                                r = Err(why);
                                break;
                            }
                        }
                        _ => {}
                    }
                    pos += end;
                }
            }
        }
        let rest = &buf[pos.min(buf.len())..];
        let mut nl = Vec::new();
        if !rest.is_empty() && r.is_ok() {
            nl.extend_from_slice(rest);
        }
        drop(left);
        self.conns[li].rleft = nl;
        r
    }

    #[inline]
    fn on_ack(&mut self, li: usize, mid: u16, now: f64) {
        let c = &mut self.conns[li];
        let p = if c.pending.front().map(|p| p.mid) == Some(mid) {
            c.pending.pop_front()
        } else if let Some(i) = c.pending.iter().position(|p| p.mid == mid) {
            c.pending.remove(i)
        } else {
            None
        };
        let Some(p) = p else { return };
        trim(&mut c.pending);
        self.c.acked += 1;
        self.inflight -= 1;
        let us = ((now - p.intended) * 1e6) as i64;
        self.hist_sec.saturating_record(us.clamp(1, HIST_MAX_US as i64) as u64);
        if let Some(w) = self.csv.as_mut() {
            let acked_ms = (self.wall_base_ms + now * 1000.0) as i64;
            let mut ib = itoa::Buffer::new();
            let _ = w.write_all(c.name.as_bytes());
            let _ = w.write_all(b",");
            let _ = w.write_all(ib.format(p.seq).as_bytes());
            let _ = w.write_all(b",");
            let _ = w.write_all(self.csv_ts.text(p.ts));
            let _ = w.write_all(b",");
            let _ = w.write_all(self.csv_acked.text(acked_ms));
            let _ = w.write_all(b"\n");
        }
    }

    /// One message for local connection li; false = refused (not connected).
    #[inline]
    fn send(&mut self, li: usize, intended: f64, now: f64) -> bool {
        let qos = self.cfg.qos;
        let wall_base = self.wall_base_ms;
        let c = &mut self.conns[li];
        if c.st != St::Up {
            return false;
        }
        let seq = c.next_seq;
        c.next_seq += 1;
        let mut ts = (wall_base + intended * 1000.0) as i64;
        if ts <= c.last_ts {
            ts = c.last_ts + 1;
        }
        c.last_ts = ts;
        let sent_ms = (wall_base + now * 1000.0) as i64;
        let mid = if qos > 0 {
            c.next_mid = if c.next_mid == u16::MAX { 1 } else { c.next_mid + 1 };
            c.next_mid
        } else {
            0
        };
        let before = c.wbuf.len();
        let (composer, stamps, gidx, raw) = (&self.composer, &mut self.stamps, c.gidx, &c.raw);
        mqtt::publish_with(&mut c.wbuf, &self.topic16, qos, mid, |out| {
            composer.render_with(out, stamps, gidx, raw, seq, ts, sent_ms)
        });
        c.wtotal += (c.wbuf.len() - before) as u64;
        c.unwritten.push_back((c.wtotal, intended));
        c.last_tx = now;
        if qos > 0 {
            if c.pending.len() >= 65535 {
                // the mid wrapped with the oldest message still un-acked: it is lost for the accounting
                if c.pending.pop_front().is_some() {
                    self.inflight -= 1;
                    self.lost_in_flight += 1;
                }
            }
            c.pending.push_back(Pending { mid, seq, intended, ts });
            self.inflight += 1;
        } else {
            self.c.acked += 1;
            if let Some(w) = self.csv.as_mut() {
                let _ = writeln!(w, "{},{},{},{}", c.name, seq, ts, sent_ms);
            }
        }
        self.mark_dirty(li);
        true
    }

    fn poll_once(&mut self, events: &mut Events, timeout: f64) {
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 0.05));
        self.io.wakeups += 1;
        if let Err(e) = self.poll.poll(events, Some(t)) {
            if e.kind() != io::ErrorKind::Interrupted {
                self.fatal = Some(format!("poll: {e}"));
            }
            return;
        }
        for ev in events.iter() {
            let li = ev.token().0;
            self.on_event(li, ev.is_readable() || ev.is_read_closed(), ev.is_writable(), ev.is_error());
        }
        self.flush_dirty();
    }

    fn misc(&mut self, now: f64, reconnect: bool) {
        let half = (self.cfg.keepalive_s as f64 / 2.0).max(0.5);
        for li in 0..self.conns.len() {
            let c = &mut self.conns[li];
            match c.st {
                St::Up => {
                    if self.cfg.keepalive_s > 0 && now - c.last_tx >= half {
                        c.wbuf.extend_from_slice(&[mqtt::PINGREQ, 0]);
                        c.wtotal += 2;
                        c.last_tx = now;
                        self.mark_dirty(li);
                    }
                }
                St::Down if reconnect && now >= c.retry_at => {
                    self.reconnects += 1;
                    self.open(li);
                }
                _ => {}
            }
        }
        self.flush_dirty();
        if let Some(w) = self.csv.as_mut() {
            let _ = w.flush();
        }
    }
}

pub fn run(cfg: Config, shard: (usize, usize), ctl: Control) -> Result<i32, String> {
    run_totals(cfg, shard, ctl).map(|(code, _)| code)
}

/// `run`, also handing back the totals line it printed (None when it ended before the load).
pub fn run_totals(mut cfg: Config, shard: (usize, usize), ctl: Control) -> Result<(i32, Option<Value>), String> {
    match cfg.transport.as_str() {
        "mqtt" => {}
        "hono-coap" => return crate::honocoap::run_totals(cfg, shard, ctl),
        o => return Err(format!("transport {o:?}: use mqtt or hono-coap")),
    }
    raise_nofile();
    if cfg.qos > 1 {
        return Err(format!("qos must be 0 or 1, got {}", cfg.qos));
    }
    if !(cfg.batch_ms >= 0.0 && cfg.batch_ms <= 1000.0) {
        return Err(format!("batch_ms must be from 0 to 1000, got {}", cfg.batch_ms));
    }
    let Shard { all, lo, hi, addr, srcs } = Shard::of(&mut cfg, shard)?;
    let (si, sn) = shard;
    let tb = cfg.topic.as_bytes();
    if tb.is_empty() || tb.len() > 65535 || cfg.topic.contains('+') || cfg.topic.contains('#') {
        return Err(format!("invalid publish topic {:?}", cfg.topic));
    }
    let mut topic16 = (tb.len() as u16).to_be_bytes().to_vec();
    topic16.extend_from_slice(tb);
    let composer = Composer::new(&cfg.payload)?;
    let plans = plan(&cfg.segments)?;
    let mut sched = ShardSchedule::new(plans, all.len() as u64, lo as u64, hi as u64);
    let conns: Vec<Conn> = (lo..hi)
        .map(|g| {
            let d = &all[g];
            Conn {
                gidx: g as u64,
                raw: json_escape(&d.name).into_bytes(),
                name: d.name.clone(),
                client_id: format!("{}{}", cfg.client_id_prefix, d.name),
                token: d.token.clone(),
                password: d.password.clone(),
                src: if srcs.is_empty() { None } else { Some(srcs[g % srcs.len()]) },
                stream: None,
                st: St::Idle,
                wbuf: Vec::new(),
                wpos: 0,
                rleft: Vec::new(),
                dirty: false,
                next_seq: 0,
                last_ts: -1,
                next_mid: 0,
                pending: VecDeque::new(),
                unwritten: VecDeque::new(),
                wtotal: 0,
                wdone: 0,
                retry_at: 0.0,
                backoff: 0.2,
                last_tx: 0.0,
            }
        })
        .collect();
    drop(all);
    // give the freed device list's pages back (they lie below the connections' allocations)
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
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
    let late_tol = cfg.late_tolerance_ms / 1000.0;
    let n_local = conns.len();
    let wall_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0;
    let mut g = Gen {
        poll: Poll::new().map_err(|e| e.to_string())?,
        conns,
        addr,
        topic16,
        composer,
        base: Instant::now(),
        wall_base_ms: wall_now,
        c: Counts::default(),
        connected: 0,
        inflight: 0,
        reconnects: 0,
        lost_in_flight: 0,
        hist_sec: new_hist(),
        hist_total: new_hist(),
        late_hist: new_hist(),
        csv,
        scratch: vec![0u8; 1 << 16],
        stamps: Stamps::default(),
        csv_ts: LastNum::default(),
        csv_acked: LastNum::default(),
        dirty: Vec::new(),
        fatal: None,
        last_error: None,
        in_connect_phase: true,
        late_tol,
        out: io::stdout(),
        io: Io::default(),
        cfg,
    };
    let mut events = Events::with_capacity(4096);
    let stop = ctl.stop.clone();

    // ---- connect phase
    let c0 = g.now();
    let mut opened = 0usize;
    let mut pending_connects = 0usize;
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
            let first = g.conns.iter().find(|c| c.st != St::Up).map(|c| c.name.clone()).unwrap_or_default();
            g.line(json!({"error": format!("broker {}: {} of {} devices not connected after {}s (first: {}; last error: {})",
                g.addr, n_local - g.connected, n_local, g.cfg.connect_timeout_s, first, g.last_error.clone().unwrap_or_default()),
                "connected": g.connected}));
            return Ok((3, None));
        }
        if opened < n_local {
            let allowed = if g.cfg.connect_rate > 0.0 {
                (((now - c0) * g.cfg.connect_rate) as usize + 1).min(n_local)
            } else {
                n_local
            };
            while opened < allowed && pending_connects < g.cfg.max_pending_connects.max(1) {
                g.open(opened);
                opened += 1;
                pending_connects += 1;
            }
        }
        g.poll_once(&mut events, 0.005);
        pending_connects = g.conns[..opened]
            .iter()
            .filter(|c| c.st == St::Connecting || c.st == St::WaitConnack)
            .count();
        // retry transient failures
        let now = g.now();
        for li in 0..opened {
            if g.conns[li].st == St::Down && now >= g.conns[li].retry_at && pending_connects < g.cfg.max_pending_connects {
                g.reconnects += 1;
                g.open(li);
                pending_connects += 1;
            }
        }
    }
    g.in_connect_phase = false;
    let connect_s = g.now() - c0;
    g.line(json!({"event": "connected", "connected": g.connected, "devices": n_local,
                  "shard": [si, sn], "range": [lo, hi], "connect_s": connect_s}));

    // ---- wait for the start
    let mut next_misc = g.now() + 0.2;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if !ctl.wait_start || ctl.start_ms.load(Ordering::Relaxed) != 0 {
            break;
        }
        let now = g.now();
        if now >= next_misc {
            g.misc(now, true);
            next_misc = now + 0.2;
        }
        g.poll_once(&mut events, 0.02);
    }
    let wall_ms_now = |g: &Gen| g.wall_base_ms + g.now() * 1000.0;
    let mut start_ms = ctl.start_ms.load(Ordering::Relaxed);
    if start_ms <= 0 {
        start_ms = g.cfg.start_at_unix_ms.unwrap_or(0);
    }
    let mut t0 = g.now();
    if start_ms > 0 {
        let delta = (start_ms as f64 - wall_ms_now(&g)) / 1000.0;
        if delta > 0.0 && delta < 60.0 {
            t0 += delta;
        }
    }
    // while waiting for a future start, keep servicing sockets
    while g.now() < t0 && !stop.load(Ordering::Relaxed) {
        let w = t0 - g.now();
        g.poll_once(&mut events, w);
    }

    // ---- load phase
    let mut sec: u64 = 0;
    let mut next_sec_at = t0 + 1.0;
    let mut prev = Counts::default();
    let mut prev_cpu = (cpu_s(), g.io);
    let cpu_load0 = prev_cpu.0;
    // never more than a quarter of the late tolerance: the batching alone never makes a message late
    let tick = g.cfg.batch_ms.min(g.cfg.late_tolerance_ms / 4.0).max(0.0) / 1000.0;
    let mut next_send = t0;
    let mut next = sched.next();
    let sched_end = t0 + sched.end();
    let mut stopped = false;
    let emit = |g: &mut Gen, s: u64, prev: &mut Counts, prev_cpu: &mut (f64, Io), sched: &ShardSchedule| {
        let cur = g.c;
        let (cpu, io) = (cpu_s(), g.io);
        let (p50, p99, mx) = pct(&g.hist_sec);
        let hist = if g.cfg.hist && g.hist_sec.len() > 0 { json!(encode_hist(&g.hist_sec)) } else { Value::Null };
        if g.hist_sec.len() > 0 {
            let _ = g.hist_total.add(&g.hist_sec);
            g.hist_sec.reset();
        }
        if let Some(w) = g.csv.as_mut() {
            let _ = w.flush();
        }
        let v = json!({
            "t": s, "target_rate": sched.rate_at(s as f64),
            "scheduled": cur.scheduled - prev.scheduled, "sent": cur.sent - prev.sent,
            "acked": cur.acked - prev.acked, "failed": cur.failed - prev.failed,
            "late": cur.late - prev.late, "dropped": cur.dropped - prev.dropped,
            "connected": g.connected, "inflight": g.inflight,
            "p50_ms": p50, "p99_ms": p99, "max_ms": mx, "hist": hist,
            "cpu_s": ((cpu - prev_cpu.0) * 1e6).round() / 1e6,
            "writes": io.writes - prev_cpu.1.writes, "reads": io.reads - prev_cpu.1.reads,
            "wakeups": io.wakeups - prev_cpu.1.wakeups,
        });
        *prev = cur;
        *prev_cpu = (cpu, io);
        g.line(v);
    };
    const MAX_BATCH: usize = 20_000;
    loop {
        let now = g.now();
        if stop.load(Ordering::Relaxed) {
            // due but never handed out: dropped
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
        while now >= next_sec_at {
            emit(&mut g, sec, &mut prev, &mut prev_cpu, &sched);
            sec += 1;
            next_sec_at = t0 + sec as f64 + 1.0;
        }
        if now >= next_misc {
            g.misc(now, true);
            next_misc = now + 0.2;
        }
        let mut n = 0;
        let sending = now >= next_send;
        while let Some((_, dev, t)) = next {
            let intended = t0 + t;
            if !sending || intended > now || n >= MAX_BATCH {
                break;
            }
            g.c.scheduled += 1;
            if g.send(dev as usize - lo, intended, now) {
                g.c.sent += 1;
            } else {
                g.c.failed += 1;
            }
            n += 1;
            next = sched.next();
        }
        if sending && n > 0 && n < MAX_BATCH {
            // the next batch: one tick on (a due message waits at most one tick; with
            // batch_ms = 0 every wake-up sends what is due, as the engine did before)
            next_send = now + tick;
        }
        g.flush_dirty();
        let due = match next {
            Some((_, _, t)) => (t0 + t).max(next_send),
            None if now >= sched_end => break,
            None => sched_end, // this shard is done; hold the connections to the schedule's end
        };
        let wake = due.min(next_sec_at).min(next_misc);
        let timeout = if n >= MAX_BATCH { 0.0 } else { wake - g.now() };
        g.poll_once(&mut events, timeout);
    }
    let _ = stopped;
    // ---- drain
    let deadline = g.now() + g.cfg.drain_timeout_s;
    while g.inflight > 0 {
        let now = g.now();
        if now >= deadline || (stopped && stop.load(Ordering::Relaxed) && now >= deadline) {
            break;
        }
        while now >= next_sec_at {
            emit(&mut g, sec, &mut prev, &mut prev_cpu, &sched);
            sec += 1;
            next_sec_at = t0 + sec as f64 + 1.0;
        }
        if now >= next_misc {
            g.misc(now, false);
            next_misc = now + 0.2;
        }
        let w = deadline.min(next_sec_at).min(next_misc) - g.now();
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
    for c in &g.conns {
        last_seq.insert(c.name.clone(), json!(c.next_seq as i64 - 1));
    }
    let late_p99 = if g.late_hist.len() > 0 { json!(g.late_hist.value_at_quantile(0.99) as f64 / 1000.0) } else { Value::Null };
    let late_max = if g.late_hist.len() > 0 { json!(g.late_hist.max() as f64 / 1000.0) } else { Value::Null };
    let c = g.c;
    let totals = json!({"totals": {
        "scheduled": c.scheduled, "sent": c.sent, "acked": c.acked, "failed": c.failed,
        "late": c.late, "dropped": c.dropped, "unacked": c.sent - c.acked,
        "last_seq": last_seq, "p50_ms": p50, "p99_ms": p99, "max_ms": mx,
        "reconnects": g.reconnects, "elapsed_s": elapsed, "lost_in_flight": g.lost_in_flight,
        "send_late_p99_ms": late_p99, "send_late_max_ms": late_max,
        "hist": if g.hist_total.len() > 0 { json!(encode_hist(&g.hist_total)) } else { Value::Null },
        "send_late_hist": if g.late_hist.len() > 0 { json!(encode_hist(&g.late_hist)) } else { Value::Null },
        "shard": [si, sn], "range": [lo, hi],
        // the engine's own cost: CPU seconds from the start of the load to here, and its syscalls
        "cpu_s": cpu_s() - cpu_load0, "writes": g.io.writes, "reads": g.io.reads, "wakeups": g.io.wakeups,
        "batch_ms": g.cfg.batch_ms,
    }});
    g.line(totals.clone());
    // ---- disconnect
    for li in 0..g.conns.len() {
        if g.conns[li].st == St::Up {
            g.conns[li].wbuf.extend_from_slice(&[mqtt::DISCONNECT, 0]);
            g.conns[li].wtotal += 2;
            g.flush(li);
        }
    }
    Ok((0, Some(totals)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_gives_back_its_high_water_capacity() {
        let mut q: VecDeque<u64> = VecDeque::new();
        q.extend(0..10_000u64);          // a latency spike: 10,000 in flight on one connection
        assert!(q.capacity() >= 10_000);
        while q.len() > 10 {
            q.pop_front();
            trim(&mut q);
        }
        assert!(q.capacity() < 1_000, "capacity {} kept after the spike", q.capacity());
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), (9_990..10_000).collect::<Vec<_>>());
        let mut small: VecDeque<u64> = VecDeque::with_capacity(TRIM_MIN);
        small.push_back(1);
        trim(&mut small);
        assert!(small.capacity() >= TRIM_MIN, "a small queue is left alone");
    }

    #[test]
    fn shard_ranges_are_disjoint_cover_and_balanced() {
        for (d, n) in [(1, 1), (7, 3), (10, 4), (50_000, 4), (12, 12), (5, 1), (3, 5)] {
            let r: Vec<(usize, usize)> = (0..n).map(|i| shard_range(d, i, n)).collect();
            assert_eq!(r[0].0, 0);
            assert_eq!(r[n - 1].1, d);
            assert!(r.windows(2).all(|w| w[0].1 == w[1].0), "{r:?}");
            let sizes: Vec<usize> = r.iter().map(|(lo, hi)| hi - lo).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
        }
        assert_eq!(shard_range(7, 1, 3), (2, 4));
    }

    #[test]
    fn config_defaults_and_python_keys() {
        let cfg: Config = serde_json::from_str(
            r#"{"port": 1883, "devices": [{"name": "a"}], "segments": [[0.0, 1.0, 2.0]]}"#,
        )
        .unwrap();
        assert_eq!(cfg.host, "127.0.0.1");
        assert_eq!((cfg.qos, cfg.keepalive_s, cfg.max_pending_connects), (1, 15, 512));
        assert_eq!(cfg.topic, "v1/devices/me/telemetry");
        assert_eq!((cfg.late_tolerance_ms, cfg.drain_timeout_s, cfg.connect_timeout_s), (50.0, 5.0, 30.0));
        assert_eq!((cfg.connect_rate, cfg.hist, cfg.batch_ms), (0.0, false, 5.0));
        assert!(cfg.payload.parts.is_empty() && cfg.acked_path.is_none() && cfg.start_at_unix_ms.is_none());
        assert_eq!(cfg.segments, vec![[0.0, 1.0, 2.0]]);
        assert!(matches!(&cfg.devices, Devices::List(v) if v.len() == 1 && v[0].token.is_empty()));

        // every key monsoon.native.loadgen_config() writes (acked_path may be null)
        let cfg: Config = serde_json::from_str(
            r#"{"host": "h", "port": 1, "qos": 0, "topic": "t", "client_id_prefix": "p-",
                "devices": [{"name": "d0", "token": "t0"}], "segments": [[0.0, 2.0, 100.0], [2.0, 3.0, 0.0]],
                "late_tolerance_ms": 20.0, "payload": {"parts": [{"lit": "{}"}]}, "acked_path": null,
                "source_addrs": ["127.0.0.2"], "connect_rate": 0.0, "keepalive_s": 15,
                "drain_timeout_s": 5.0, "connect_timeout_s": 30.0, "hist": true}"#,
        )
        .unwrap();
        assert_eq!((cfg.qos, cfg.late_tolerance_ms, cfg.hist), (0, 20.0, true));
        assert_eq!(cfg.source_addrs, vec!["127.0.0.2".to_string()]);

        // a devices CSV path; unknown keys are refused (a typo must not be silently ignored)
        let cfg: Config =
            serde_json::from_str(r#"{"port": 1, "devices": "/x.csv", "segments": []}"#).unwrap();
        assert!(matches!(&cfg.devices, Devices::Csv(p) if p == "/x.csv"));
        let e = serde_json::from_str::<Config>(r#"{"port": 1, "devices": [], "segments": [], "qso": 1}"#);
        assert!(e.unwrap_err().to_string().contains("qso"));
        assert!(serde_json::from_str::<Config>(r#"{"port": 1, "devices": [], "segments": [[0, 1]]}"#).is_err());
    }

    #[test]
    fn devices_csv_header_blank_lines_and_missing_tokens() {
        let path = std::env::temp_dir().join(format!("monsoon-loadgen-test-{}.csv", std::process::id()));
        std::fs::write(&path, "name,token\n d0 , t0 \n\nd1,\nd2\nd3,a,b\n").unwrap();
        let got = load_devices(&Devices::Csv(path.to_string_lossy().into_owned()));
        std::fs::remove_file(&path).unwrap();
        let got: Vec<(String, String)> = got.unwrap().into_iter().map(|d| (d.name, d.token)).collect();
        let want = [("d0", "t0"), ("d1", ""), ("d2", ""), ("d3", "a,b")];
        assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())));
        // no header line: the first line is a device
        let path = std::env::temp_dir().join(format!("monsoon-loadgen-test2-{}.csv", std::process::id()));
        std::fs::write(&path, "x,1\n").unwrap();
        let got = load_devices(&Devices::Csv(path.to_string_lossy().into_owned()));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(got.unwrap()[0].name, "x");
        let e = load_devices(&Devices::Csv("/nonexistent/monsoon.csv".into())).err().unwrap();
        assert!(e.starts_with("devices CSV /nonexistent/monsoon.csv: "), "{e}");
    }

    /// The engine against a real sink in this process: every message acked, and the batching tick
    /// carries many publishes per write (with batch_ms = 0 each wake-up writes what is due).
    fn run_against_sink(batch_ms: f64, rate: f64) -> Value {
        let l = crate::sink::listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop_sink = Arc::new(AtomicBool::new(false));
        let st = stop_sink.clone();
        let h = std::thread::spawn(move || crate::sink::serve(l, st));
        let dir = std::env::temp_dir().join(format!("monsoon-loadgen-batch-{}-{}", std::process::id(), batch_ms));
        let cfg: Config = serde_json::from_value(json!({
            "port": port, "devices": [{"name": "d0"}, {"name": "d1"}], "segments": [[0.0, 0.5, rate]],
            "batch_ms": batch_ms, "acked_path": dir.join("acked-{shard}.csv").to_string_lossy(),
        })).unwrap();
        let ctl = Control { stop: Arc::new(AtomicBool::new(false)), start_ms: Arc::new(AtomicI64::new(0)), wait_start: false };
        let (code, totals) = run_totals(cfg, (0, 1), ctl).unwrap();
        stop_sink.store(true, Ordering::SeqCst);
        h.join().unwrap().unwrap();
        let acked_lines = std::fs::read_to_string(dir.join("acked-0.csv")).unwrap().lines().count();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(code, 0);
        let t = totals.unwrap()["totals"].clone();
        assert_eq!(acked_lines as u64, 1 + t["acked"].as_u64().unwrap(), "one acked line per ack + header");
        t
    }

    #[test]
    fn a_batching_tick_puts_many_publishes_in_one_write() {
        let t = run_against_sink(20.0, 4000.0);
        let (acked, writes) = (t["acked"].as_u64().unwrap(), t["writes"].as_u64().unwrap());
        assert_eq!((t["scheduled"].as_u64(), t["late"].as_u64()), (Some(2000), Some(0)));
        assert_eq!(acked, 2000);
        // 2 connections, 2,000 msg/s each, a write per connection every >= 12.5 ms (the tick is
        // clamped to a quarter of the 50 ms late tolerance): >= 25 publishes a write, give or take
        assert!(writes * 10 <= acked, "{writes} writes for {acked} messages");
        assert!(t["cpu_s"].as_f64().unwrap() > 0.0 && t["wakeups"].as_u64().unwrap() > 0);
        assert_eq!(t["batch_ms"].as_f64(), Some(20.0));
    }

    /// A scripted MQTT sink for the event loop's tests (blocking std sockets, a thread per
    /// connection): CONNACK for CONNECT, PUBACK for every QoS 1 PUBLISH, PINGRESP for PINGREQ.
    /// `close_first_after`: the sink closes the first connection on its n-th PUBLISH (unacked);
    /// `split_acks`: every PUBACK goes out in two writes (after 1, 2 or 3 of its 4 bytes, in
    /// turn) with a pause between them, so the engine reads half a packet first.
    /// Hands back the port, a stop flag, and per connection (client id, PUBLISHes, PUBACKs).
    struct ScriptedSink {
        port: u16,
        stop: Arc<AtomicBool>,
        log: Arc<std::sync::Mutex<Vec<(String, u64, u64)>>>,
        thread: std::thread::JoinHandle<()>,
    }

    fn scripted_sink(close_first_after: Option<u64>, split_acks: bool) -> ScriptedSink {
        use std::net::{Shutdown, TcpListener};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<std::sync::Mutex<Vec<(String, u64, u64)>>> = Arc::default();
        let (st, lg) = (stop.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !st.load(Ordering::SeqCst) {
                let mut s = match l.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    Err(e) => panic!("accept: {e}"),
                };
                let k = {
                    let mut g = lg.lock().unwrap();
                    g.push((String::new(), 0, 0));
                    g.len() - 1
                };
                let (st, lg) = (st.clone(), lg.clone());
                workers.push(std::thread::spawn(move || {
                    s.set_nonblocking(false).unwrap();
                    s.set_nodelay(true).unwrap();
                    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                    let (mut buf, mut rd) = (Vec::new(), [0u8; 65536]);
                    let mut splits = 0usize;
                    while !st.load(Ordering::SeqCst) {
                        let n = match s.read(&mut rd) {
                            Ok(0) => return,
                            Ok(n) => n,
                            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                            Err(_) => return,
                        };
                        buf.extend_from_slice(&rd[..n]);
                        let mut pos = 0;
                        while let Ok(Some((h, b, end))) = mqtt::frame(&buf[pos..]) {
                            let body = buf[pos + b..pos + end].to_vec();
                            pos += end;
                            let reply: Vec<u8> = match h & 0xF0 {
                                mqtt::CONNECT => {
                                    // protocol name (6), level, flags, keepalive (4), then the client id
                                    let n = u16::from_be_bytes([body[10], body[11]]) as usize;
                                    lg.lock().unwrap()[k].0 = String::from_utf8_lossy(&body[12..12 + n]).into_owned();
                                    vec![mqtt::CONNACK, 2, 0, 0]
                                }
                                mqtt::PUBLISH if (h >> 1) & 3 == 1 => {
                                    let tl = u16::from_be_bytes([body[0], body[1]]) as usize;
                                    let published = {
                                        let mut g = lg.lock().unwrap();
                                        g[k].1 += 1;
                                        g[k].1
                                    };
                                    if k == 0 && Some(published) == close_first_after {
                                        let _ = s.shutdown(Shutdown::Both);
                                        return;
                                    }
                                    vec![mqtt::PUBACK, 2, body[2 + tl], body[3 + tl]]
                                }
                                mqtt::PINGREQ => vec![mqtt::PINGRESP, 0],
                                mqtt::DISCONNECT => return,
                                _ => continue,
                            };
                            if split_acks && reply[0] == mqtt::PUBACK {
                                let cut = 1 + splits % 3;
                                splits += 1;
                                s.write_all(&reply[..cut]).unwrap();
                                std::thread::sleep(Duration::from_millis(2));
                                s.write_all(&reply[cut..]).unwrap();
                            } else if s.write_all(&reply).is_err() {
                                return;
                            }
                            if reply[0] == mqtt::PUBACK {
                                lg.lock().unwrap()[k].2 += 1;
                            }
                        }
                        buf.drain(..pos);
                    }
                }));
            }
            for w in workers {
                w.join().unwrap();
            }
        });
        ScriptedSink { port, stop, log, thread }
    }

    fn run_against(sink: ScriptedSink, cfg: Value) -> (i32, Value, Vec<(String, u64, u64)>) {
        let mut cfg = cfg;
        cfg["port"] = json!(sink.port);
        let cfg: Config = serde_json::from_value(cfg).unwrap();
        let ctl = Control { stop: Arc::new(AtomicBool::new(false)), start_ms: Arc::new(AtomicI64::new(0)), wait_start: false };
        let r = run_totals(cfg, (0, 1), ctl);
        sink.stop.store(true, Ordering::SeqCst);
        sink.thread.join().unwrap();
        let (code, totals) = r.unwrap();
        let log = sink.log.lock().unwrap().clone();
        (code, totals.unwrap()["totals"].clone(), log)
    }

    #[test]
    fn the_loop_paces_messages_at_the_configured_rate_never_ahead() {
        // 400 msg/s over 2 s, two devices: the schedule puts message k at k/400 s
        let dir = std::env::temp_dir().join(format!("monsoon-loadgen-pacing-{}", std::process::id()));
        let acked = dir.join("acked-{shard}.csv");
        let (code, t, log) = run_against(scripted_sink(None, false), json!({
            "devices": [{"name": "d0"}, {"name": "d1"}], "segments": [[0.0, 2.0, 400.0]],
            "acked_path": acked.to_string_lossy()}));
        let text = std::fs::read_to_string(dir.join("acked-0.csv")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(code, 0);
        for k in ["scheduled", "sent", "acked"] {
            assert_eq!(t[k].as_u64(), Some(800), "{k}: {t}");
        }
        assert_eq!((t["failed"].as_u64(), t["dropped"].as_u64(), t["reconnects"].as_u64()), (Some(0), Some(0), Some(0)));
        assert_eq!(log.iter().map(|c| c.1).sum::<u64>(), 800, "{log:?}");
        // device,seq,intended_ms,acked_ms: no message leaves before its time (the rate is never
        // exceeded), the intended times are the rate's, and the acks spread over the window
        let rows: Vec<(i64, i64)> = text.lines().skip(1).map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[2].parse().unwrap(), f[3].parse().unwrap())
        }).collect();
        assert_eq!(rows.len(), 800);
        assert!(rows.iter().all(|(i, a)| a >= i), "a message acked before its intended time");
        let first = rows.iter().map(|r| r.0).min().unwrap();
        let span = rows.iter().map(|r| r.0).max().unwrap() - first;
        assert!((1990..=2000).contains(&span), "intended times span {span} ms, want ~1997.5");
        // never ahead: at most the first second's 400 (+1 for rounding) are acked in it; not held
        // back to the end either (generous: a quarter of the rate, whatever the machine's load)
        let in_first_s = rows.iter().filter(|r| r.1 < first + 1000).count();
        assert!((100..=401).contains(&in_first_s), "{in_first_s} of 800 acked in the first second");
    }

    #[test]
    fn the_loop_reconnects_when_the_sink_closes_and_carries_on() {
        // one device at 200 msg/s for 1.5 s; the sink drops the connection on the 50th PUBLISH
        let (code, t, log) = run_against(scripted_sink(Some(50), false), json!({
            "devices": [{"name": "d0"}], "segments": [[0.0, 1.5, 200.0]], "drain_timeout_s": 10.0}));
        assert_eq!(code, 0, "{t}");
        assert!(log.len() >= 2 && log.iter().all(|c| c.0 == "d0"), "{log:?}");
        assert_eq!((log[0].1, log[0].2), (50, 49), "the first connection: 50 PUBLISHes, 49 acked");
        assert!(t["reconnects"].as_u64().unwrap() >= 1, "{t}");
        let later: u64 = log[1..].iter().map(|c| c.2).sum();
        assert!(later > 0, "nothing acked after the reconnect: {log:?}");
        let (sched, sent, failed) = (t["scheduled"].as_u64().unwrap(), t["sent"].as_u64().unwrap(), t["failed"].as_u64().unwrap());
        assert_eq!(sched, 300);
        assert_eq!(sent + failed, sched, "{t}");
        // every message sent is acked or counted lost in flight (the close took the un-acked ones)
        assert!(t["lost_in_flight"].as_u64().unwrap() >= 1, "{t}");
        assert_eq!(t["unacked"].as_u64(), t["lost_in_flight"].as_u64(), "{t}");
        assert!(t["acked"].as_u64().unwrap() <= log.iter().map(|c| c.2).sum::<u64>());
        assert!(t["acked"].as_u64().unwrap() >= 49 + later.min(1));
    }

    #[test]
    fn a_puback_written_in_two_halves_is_parsed_once_whole() {
        // each PUBACK arrives as 1+3, 2+2 or 3+1 bytes: none may be lost, doubled or malformed
        let (code, t, log) = run_against(scripted_sink(None, true), json!({
            "devices": [{"name": "d0"}, {"name": "d1"}], "segments": [[0.0, 1.0, 120.0]]}));
        assert_eq!(code, 0, "{t}");
        assert_eq!(log.len(), 2, "{log:?}");
        for k in ["scheduled", "sent", "acked"] {
            assert_eq!(t[k].as_u64(), Some(120), "{k}: {t}");
        }
        assert_eq!(log.iter().map(|c| c.2).sum::<u64>(), 120, "{log:?}");
        assert_eq!((t["reconnects"].as_u64(), t["lost_in_flight"].as_u64(), t["unacked"].as_u64()), (Some(0), Some(0), Some(0)));
    }

    #[test]
    fn batch_ms_out_of_range_is_refused() {
        let cfg: Config = serde_json::from_value(json!({"port": 1, "devices": [{"name": "a"}],
            "segments": [[0.0, 1.0, 1.0]], "batch_ms": -1.0})).unwrap();
        let ctl = Control { stop: Arc::new(AtomicBool::new(false)), start_ms: Arc::new(AtomicI64::new(0)), wait_start: false };
        assert_eq!(run(cfg, (0, 1), ctl), Err("batch_ms must be from 0 to 1000, got -1".to_string()));
    }

    #[test]
    fn cpu_seconds_only_grow() {
        let a = cpu_s();
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(cpu_s() >= a && a > 0.0);
    }

    #[test]
    fn latency_histogram_round_trips_through_base64() {
        let mut h = new_hist();
        for us in [1u64, 900, 1_500, 250_000] {
            h.record(us).unwrap();
        }
        let (p50, p99, mx) = pct(&h);
        assert_eq!(p50.as_f64().unwrap(), h.value_at_quantile(0.5) as f64 / 1000.0);
        assert!((0.89..=0.91).contains(&p50.as_f64().unwrap()), "{p50}");
        assert!((249.0..=251.0).contains(&mx.as_f64().unwrap()) && p99 == mx);
        let bytes = base64::engine::general_purpose::STANDARD.decode(encode_hist(&h)).unwrap();
        let back: Histogram<u64> =
            hdrhistogram::serialization::Deserializer::new().deserialize(&mut &bytes[..]).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back.max(), h.max());
        assert_eq!(pct(&new_hist()), (Value::Null, Value::Null, Value::Null));
    }
}
