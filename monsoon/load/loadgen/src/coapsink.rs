//! `monsoon-loadgen coap-sink`: monsoon's own CoAP-over-DTLS (PSK) endpoint, answering like Hono's CoAP adapter
//! does, without a backend: 2.04 to every POST (telemetry, event, command response), and to a command query
//! (`?hono-ttd=N`) 2.04 with a command (`Location-Path: command_response/<req-id>`) at once, every
//! `command_every`-th query (0 = never: 2.04 without a command, as when the ttd ends); 2.05 to a GET.
//! `fail_every` > 0 answers every so many POSTs 5.03 instead (to see errors counted by code); `separate_every` > 0
//! answers every so many confirmable POSTs with an empty ACK and then a separate confirmable response.
//! One thread per SO_REUSEPORT socket (the kernel keeps a client's datagrams on one of them); a session per
//! client address. Devices' keys come from a JSON device list ([{token, password}] or {"devices": [...]}, the
//! load engine's config): identity = token, key = SHA-256(password)[..16] (`monsoon.stack.provision.psk_key`).
use crate::coap::{self, Builder, Msg};
use crate::dtls::{self, PeerIo};
use openssl::ssl::{ErrorCode, SslContext, SslStream};
use serde_json::{json, Value};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Opts {
    pub port: u16,
    pub threads: usize,
    pub keys: HashMap<Vec<u8>, Vec<u8>>,
    pub command_every: u64,
    pub fail_every: u64,
    pub separate_every: u64,
}

#[derive(Default)]
struct Counters {
    handshakes: AtomicU64,
    failed_handshakes: AtomicU64,
    requests: AtomicU64,
    commands: AtomicU64,
    failed: AtomicU64,
    separate: AtomicU64,
}

/// identity -> key of the devices in a JSON file (a list of devices, or an object with a `devices` list).
pub fn load_keys(path: &str) -> Result<HashMap<Vec<u8>, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("keys {path}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("keys {path}: {e}"))?;
    let list = v.get("devices").unwrap_or(&v).as_array().ok_or_else(|| format!("keys {path}: no device list"))?;
    let mut keys = HashMap::new();
    for d in list {
        let token = d.get("token").and_then(Value::as_str).ok_or_else(|| format!("keys {path}: a device without a token"))?;
        let secret = d.get("password").and_then(Value::as_str).unwrap_or("");
        keys.insert(token.as_bytes().to_vec(), dtls::psk_key(secret));
    }
    Ok(keys)
}

fn bind(port: u16) -> std::io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.set_reuse_address(true)?;
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    s.bind(&SocketAddr::from(([127, 0, 0, 1], port)).into())?;
    let u: UdpSocket = s.into();
    u.set_read_timeout(Some(Duration::from_millis(100)))?;
    Ok(u)
}

struct Sess {
    stream: SslStream<PeerIo>,
    up: bool,
}

struct Worker {
    ctx: SslContext,
    sock: Rc<UdpSocket>,
    sessions: HashMap<SocketAddr, Sess>,
    n: Arc<Counters>,
    command_every: u64,
    fail_every: u64,
    separate_every: u64,
    separate_mid: u16,
    queries: u64,
    posts: u64,
    next_req: u64,
    out: Vec<u8>,
    /// a separate response to send after the answer (the answer then is the empty ACK)
    second: Option<Vec<u8>>,
}

impl Worker {
    fn answer(&mut self, req: &[u8]) -> Option<Vec<u8>> {
        let m = Msg::parse(req).ok()?;
        if m.code == coap::EMPTY || m.typ == coap::ACK || m.typ == coap::RST {
            return None; // a ping's reply or an ACK of ours: nothing to answer
        }
        self.n.requests.fetch_add(1, Ordering::Relaxed);
        let (mut typ, mut mid) = if m.typ == coap::CON { (coap::ACK, m.mid) } else { (coap::NON, m.mid.wrapping_add(0x8000)) };
        self.out.clear();
        let mut out = std::mem::take(&mut self.out);
        if m.code == coap::POST && m.typ == coap::CON && self.separate_every > 0 && (self.posts + 1) % self.separate_every == 0 {
            // a separate response, as Hono's adapter answers when its backend takes longer than its ACK timeout:
            // an empty ACK now, then the response as a confirmable message of its own
            coap::empty(&mut out, coap::ACK, m.mid);
            self.separate_mid = self.separate_mid.wrapping_add(1);
            self.n.separate.fetch_add(1, Ordering::Relaxed);
            (typ, mid) = (coap::CON, self.separate_mid);
        }
        let mut out2 = Vec::new();
        let out_ref: &mut Vec<u8> = if out.is_empty() { &mut out } else { &mut out2 };
        if m.code == coap::GET {
            Builder::new(out_ref, typ, coap::CONTENT, mid, m.token).uint(coap::OPT_CONTENT_FORMAT, 40).payload(b"</telemetry>,</event>");
        } else if m.code == coap::POST {
            self.posts += 1;
            let query = m.opt_all(coap::OPT_URI_QUERY).any(|q| q.starts_with(b"hono-ttd="));
            if self.fail_every > 0 && self.posts % self.fail_every == 0 {
                self.n.failed.fetch_add(1, Ordering::Relaxed);
                Builder::new(out_ref, typ, 0xa3, mid, m.token); // 5.03
            } else if query {
                self.queries += 1;
                if self.command_every > 0 && self.queries % self.command_every == 0 {
                    self.next_req += 1;
                    self.n.commands.fetch_add(1, Ordering::Relaxed);
                    let id = format!("req{}", self.next_req);
                    Builder::new(out_ref, typ, coap::CHANGED, mid, m.token)
                        .opt(coap::OPT_LOCATION_PATH, b"command_response")
                        .opt(coap::OPT_LOCATION_PATH, id.as_bytes())
                        .uint(coap::OPT_CONTENT_FORMAT, 50)
                        .payload(b"{\"command\": \"ping\"}");
                } else {
                    Builder::new(out_ref, typ, coap::CHANGED, mid, m.token);
                }
            } else {
                Builder::new(out_ref, typ, coap::CHANGED, mid, m.token);
            }
        } else {
            Builder::new(out_ref, typ, 0x85, mid, m.token); // 4.05 Method Not Allowed
        }
        if !out2.is_empty() {
            self.second = Some(out2);
        }
        Some(out)
    }

    fn datagram(&mut self, peer: SocketAddr, data: &[u8]) {
        if is_client_hello(data) && self.sessions.get(&peer).is_some_and(|s| s.up) {
            // a new client on an address whose session is still open (a client that left without close_notify,
            // its port now another's): RFC 6347 4.2.8, the new handshake replaces the old session
            self.sessions.remove(&peer);
        }
        if !self.sessions.contains_key(&peer) {
            let Ok(ssl) = dtls::new_ssl(&self.ctx) else { return };
            let io = PeerIo { inbox: Default::default(), sock: self.sock.clone(), peer };
            let Ok(stream) = SslStream::new(ssl, io) else { return };
            self.sessions.insert(peer, Sess { stream, up: false });
        }
        let s = self.sessions.get_mut(&peer).unwrap();
        s.stream.get_mut().inbox.push_back(data.to_vec());
        let mut drop_it = false;
        if !s.up {
            match s.stream.accept() {
                Ok(()) => {
                    s.up = true;
                    self.n.handshakes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => {}
                Err(_) => {
                    self.n.failed_handshakes.fetch_add(1, Ordering::Relaxed);
                    drop_it = true;
                }
            }
        }
        let mut buf = [0u8; 2048];
        while !drop_it && self.sessions[&peer].up {
            let r = self.sessions.get_mut(&peer).unwrap().stream.ssl_read(&mut buf);
            match r {
                Ok(n) => {
                    if let Some(resp) = self.answer(&buf[..n]) {
                        let s = self.sessions.get_mut(&peer).unwrap();
                        let _ = s.stream.ssl_write(&resp);
                        if let Some(second) = self.second.take() {
                            let _ = s.stream.ssl_write(&second);
                        }
                        self.out = resp;
                    }
                }
                Err(e) if e.code() == ErrorCode::WANT_READ || e.code() == ErrorCode::WANT_WRITE => break,
                Err(_) => {
                    drop_it = true; // close_notify or a broken session: a new handshake starts afresh
                }
            }
        }
        if drop_it {
            self.sessions.remove(&peer);
        }
    }

    fn timers(&mut self) {
        for s in self.sessions.values_mut() {
            if !s.up {
                dtls::handle_timeout(s.stream.ssl());
                let _ = s.stream.accept();
            }
        }
    }
}

/// A DTLS record of epoch 0 carrying a ClientHello (content type 22, handshake type 1 at byte 13).
pub fn is_client_hello(d: &[u8]) -> bool {
    d.len() > 13 && d[0] == 22 && d[3] == 0 && d[4] == 0 && d[13] == 1
}

fn serve(ctx: SslContext, sock: UdpSocket, n: Arc<Counters>, stop: Arc<AtomicBool>, command_every: u64, fail_every: u64,
         separate_every: u64) {
    let mut w = Worker {
        ctx,
        sock: Rc::new(sock),
        sessions: HashMap::new(),
        n,
        command_every,
        fail_every,
        separate_every,
        separate_mid: 0,
        second: None,
        queries: 0,
        posts: 0,
        next_req: 0,
        out: Vec::with_capacity(256),
    };
    let mut buf = vec![0u8; 65536];
    let mut next_timers = Instant::now() + Duration::from_millis(200);
    while !stop.load(Ordering::Relaxed) {
        match w.sock.recv_from(&mut buf) {
            Ok((len, peer)) => {
                let data = buf[..len].to_vec();
                w.datagram(peer, &data);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(_) => {}
        }
        if Instant::now() >= next_timers {
            w.timers();
            next_timers = Instant::now() + Duration::from_millis(200);
        }
    }
}

pub fn run(o: Opts, stop: Arc<AtomicBool>) -> Result<i32, String> {
    let n = Arc::new(Counters::default());
    let mut handles = Vec::new();
    let mut socks = Vec::new();
    for _ in 0..o.threads.max(1) {
        socks.push(bind(o.port).map_err(|e| format!("coap-sink: bind 127.0.0.1:{}: {e}", o.port))?);
    }
    let port = socks[0].local_addr().map_err(|e| e.to_string())?.port();
    let devices = o.keys.len();
    for sock in socks {
        let ctx = dtls::server_context(o.keys.clone()).map_err(|e| format!("coap-sink: DTLS context: {e}"))?;
        let (n, stop) = (n.clone(), stop.clone());
        let (ce, fe, se) = (o.command_every, o.fail_every, o.separate_every);
        handles.push(std::thread::spawn(move || serve(ctx, sock, n, stop, ce, fe, se)));
    }
    println!("{}", json!({"event": "listening", "port": port, "devices": devices}));
    for h in handles {
        let _ = h.join();
    }
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "{}",
        json!({"sink": {"handshakes": g(&n.handshakes), "failed_handshakes": g(&n.failed_handshakes),
                        "requests": g(&n.requests), "commands": g(&n.commands), "failed": g(&n.failed),
                        "separate": g(&n.separate)}})
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A blocking connected UDP socket under a client session (the engine's own is non-blocking, on mio).
    #[derive(Debug)]
    struct Blocking(UdpSocket);
    impl Read for Blocking {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            self.0.recv(b)
        }
    }
    impl Write for Blocking {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.send(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn sink(command_every: u64) -> (SocketAddr, Arc<AtomicBool>, Arc<Counters>) {
        let mut keys = HashMap::new();
        keys.insert(b"dev-1@T".to_vec(), dtls::psk_key("s3cret"));
        let sock = bind(0).unwrap();
        let addr = sock.local_addr().unwrap();
        let (stop, n) = (Arc::new(AtomicBool::new(false)), Arc::new(Counters::default()));
        let ctx = dtls::server_context(keys).unwrap();
        let (s2, n2) = (stop.clone(), n.clone());
        std::thread::spawn(move || serve(ctx, sock, n2, s2, command_every, 0, 0));
        (addr, stop, n)
    }

    fn client(addr: SocketAddr, secret: &str) -> Result<SslStream<Blocking>, String> {
        let (ctx, idx) = dtls::client_context().unwrap();
        let mut ssl = dtls::new_ssl(&ctx).unwrap();
        ssl.set_ex_data(idx, dtls::Psk { identity: b"dev-1@T".to_vec(), key: dtls::psk_key(secret) });
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.connect(addr).unwrap();
        u.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
        ssl.connect(Blocking(u)).map_err(|e| format!("{e}"))
    }

    #[test]
    fn psk_handshake_and_hono_answers() {
        let (addr, stop, n) = sink(1);
        let mut s = client(addr, "s3cret").expect("handshake");
        let mut req = Vec::new();
        Builder::new(&mut req, coap::CON, coap::POST, 77, &[1, 2, 3, 4])
            .path(coap::OPT_URI_PATH, "telemetry")
            .opt(coap::OPT_URI_QUERY, b"hono-ttd=5")
            .payload(b"{}");
        s.ssl_write(&req).unwrap();
        let mut buf = [0u8; 1500];
        let k = s.ssl_read(&mut buf).unwrap();
        let m = Msg::parse(&buf[..k]).unwrap();
        assert_eq!((m.typ, m.code, m.mid, m.token), (coap::ACK, coap::CHANGED, 77, &[1u8, 2, 3, 4][..]));
        assert_eq!(m.path(coap::OPT_LOCATION_PATH), "command_response/req1");
        let mut req = Vec::new();
        Builder::new(&mut req, coap::CON, coap::POST, 78, &[5]).path(coap::OPT_URI_PATH, "event");
        s.ssl_write(&req).unwrap();
        let k = s.ssl_read(&mut buf).unwrap();
        let m = Msg::parse(&buf[..k]).unwrap();
        assert_eq!((m.code, m.mid), (coap::CHANGED, 78));
        assert_eq!(m.opt_all(coap::OPT_LOCATION_PATH).count(), 0);
        stop.store(true, Ordering::Relaxed);
        assert_eq!(n.handshakes.load(Ordering::Relaxed), 1);
        assert_eq!(n.requests.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_wrong_key_never_completes_the_handshake() {
        let (addr, stop, n) = sink(1);
        assert!(client(addr, "not-it").is_err());
        stop.store(true, Ordering::Relaxed);
        assert_eq!(n.handshakes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn client_hello_records() {
        let mut d = vec![22u8, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 50, 1, 0];
        assert!(is_client_hello(&d));
        d[4] = 1; // epoch 1: encrypted, not a new handshake
        assert!(!is_client_hello(&d));
        assert!(!is_client_hello(&[23u8; 20]));
    }
}
