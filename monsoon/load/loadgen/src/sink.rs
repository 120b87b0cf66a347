//! `monsoon-loadgen sink`: an ack-only MQTT 3.1.1 server for benchmarks. CONNACK for every
//! CONNECT, PUBACK for every QoS1 PUBLISH, PINGRESP, SUBACK (granting QoS 0); no routing,
//! no storage. Each thread has its own SO_REUSEPORT listener on 127.0.0.1:PORT, so threads
//! and whole sink processes share one port (the kernel spreads connections over them).
use crate::mqtt;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LISTENER: Token = Token(usize::MAX - 1);

struct SConn {
    s: TcpStream,
    left: Vec<u8>,
    out: Vec<u8>,
    opos: usize,
}

pub fn listener(port: u16) -> io::Result<TcpListener> {
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_nonblocking(true)?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    sock.bind(&addr.into())?;
    sock.listen(8192)?;
    let std: std::net::TcpListener = sock.into();
    Ok(TcpListener::from_std(std))
}

fn handle(data: &[u8], out: &mut Vec<u8>) -> Result<usize, bool> {
    // returns consumed bytes; Err(true) = DISCONNECT, Err(false) = malformed
    let mut pos = 0;
    while pos < data.len() {
        match mqtt::frame(&data[pos..]) {
            Err(()) => return Err(false),
            Ok(None) => break,
            Ok(Some((h, b, end))) => {
                let body = &data[pos + b..pos + end];
                match h & 0xF0 {
                    mqtt::CONNECT => out.extend_from_slice(&[mqtt::CONNACK, 2, 0, 0]),
                    mqtt::PUBLISH => {
                        let qos = (h >> 1) & 3;
                        if qos > 0 && body.len() >= 2 {
                            let tl = u16::from_be_bytes([body[0], body[1]]) as usize;
                            if body.len() >= 4 + tl {
                                let (m0, m1) = (body[2 + tl], body[3 + tl]);
                                // QoS2 would need PUBREC; answer PUBACK-style for QoS1 only
                                let t = if qos == 1 { mqtt::PUBACK } else { 0x50 };
                                out.extend_from_slice(&[t, 2, m0, m1]);
                            }
                        }
                    }
                    0x60 if body.len() >= 2 => out.extend_from_slice(&[0x70, 2, body[0], body[1]]), // PUBREL -> PUBCOMP
                    mqtt::SUBSCRIBE if body.len() >= 2 => {
                        // count topic filters
                        let mut i = 2;
                        let mut n = 0;
                        while i + 2 <= body.len() {
                            let l = u16::from_be_bytes([body[i], body[i + 1]]) as usize;
                            i += 2 + l + 1;
                            n += 1;
                        }
                        out.push(mqtt::SUBACK);
                        mqtt::put_len(out, 2 + n);
                        out.extend_from_slice(&body[..2]);
                        out.extend(std::iter::repeat(0u8).take(n));
                    }
                    0xA0 if body.len() >= 2 => out.extend_from_slice(&[0xB0, 2, body[0], body[1]]), // UNSUBACK
                    mqtt::PINGREQ => out.extend_from_slice(&[mqtt::PINGRESP, 0]),
                    mqtt::DISCONNECT => return Err(true),
                    _ => {}
                }
                pos += end;
            }
        }
    }
    Ok(pos)
}

pub fn serve(mut l: TcpListener, stop: Arc<AtomicBool>) -> io::Result<()> {
    let mut poll = Poll::new()?;
    poll.registry().register(&mut l, LISTENER, Interest::READABLE)?;
    let mut conns: Vec<Option<SConn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = Events::with_capacity(4096);
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(100))) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                loop {
                    match l.accept() {
                        Ok((mut s, _)) => {
                            let _ = s.set_nodelay(true);
                            let i = free.pop().unwrap_or_else(|| {
                                conns.push(None);
                                conns.len() - 1
                            });
                            if poll.registry().register(&mut s, Token(i), Interest::READABLE | Interest::WRITABLE).is_ok() {
                                conns[i] = Some(SConn { s, left: Vec::new(), out: Vec::new(), opos: 0 });
                            } else {
                                free.push(i);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => break, // EMFILE etc.: try again on the next event
                    }
                }
                continue;
            }
            let i = ev.token().0;
            let Some(c) = conns.get_mut(i).and_then(|c| c.as_mut()) else { continue };
            let mut close = false;
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                loop {
                    match c.s.read(&mut buf) {
                        Ok(0) => {
                            close = true;
                            break;
                        }
                        Ok(n) => {
                            let r = if c.left.is_empty() {
                                match handle(&buf[..n], &mut c.out) {
                                    Ok(k) => {
                                        c.left.extend_from_slice(&buf[k..n]);
                                        Ok(())
                                    }
                                    Err(e) => Err(e),
                                }
                            } else {
                                c.left.extend_from_slice(&buf[..n]);
                                match handle(&c.left, &mut c.out) {
                                    Ok(k) => {
                                        c.left.drain(..k);
                                        Ok(())
                                    }
                                    Err(e) => Err(e),
                                }
                            };
                            if r.is_err() {
                                close = true;
                                break;
                            }
                            if n < buf.len() {
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => {
                            close = true;
                            break;
                        }
                    }
                }
            }
            if !close && c.opos < c.out.len() {
                loop {
                    match c.s.write(&c.out[c.opos..]) {
                        Ok(0) => {
                            close = true;
                            break;
                        }
                        Ok(n) => {
                            c.opos += n;
                            if c.opos >= c.out.len() {
                                c.out.clear();
                                c.opos = 0;
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => {
                            close = true;
                            break;
                        }
                    }
                }
            }
            if close {
                if let Some(mut c) = conns[i].take() {
                    let _ = poll.registry().deregister(&mut c.s);
                }
                free.push(i);
            }
        }
    }
    Ok(())
}

pub fn run(port: u16, threads: usize, stop: Arc<AtomicBool>) -> Result<i32, String> {
    crate::gen::raise_nofile_pub();
    let mut hs = Vec::new();
    for t in 0..threads.max(1) {
        let l = listener(port).map_err(|e| format!("sink: cannot listen on 127.0.0.1:{port}: {e}"))?;
        let stop = stop.clone();
        hs.push(std::thread::Builder::new().name(format!("sink-{t}")).spawn(move || serve(l, stop)).unwrap());
    }
    println!("{}", serde_json::json!({"event": "listening", "port": port, "threads": threads.max(1), "pid": std::process::id()}));
    let _ = io::stdout().flush();
    for h in hs {
        if let Ok(Err(e)) = h.join() {
            return Err(format!("sink: {e}"));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(qos: u8, mid: u16) -> Vec<u8> {
        let mut b = Vec::new();
        mqtt::publish(&mut b, &[0, 1, b't'], qos, mid, b"{}");
        b
    }

    #[test]
    fn answers_connect_publish_ping() {
        let mut data = Vec::new();
        mqtt::connect(&mut data, "c", "u", None, 15);
        data.extend(publish(1, 0xBEEF));
        data.extend(publish(0, 0)); // QoS 0: no answer
        data.extend([mqtt::PINGREQ, 0]);
        data.extend(publish(1, 1));
        let mut out = Vec::new();
        assert_eq!(handle(&data, &mut out), Ok(data.len()));
        assert_eq!(
            out,
            [mqtt::CONNACK, 2, 0, 0, mqtt::PUBACK, 2, 0xBE, 0xEF, mqtt::PINGRESP, 0, mqtt::PUBACK, 2, 0, 1]
        );
    }

    #[test]
    fn qos2_and_subscribe_unsubscribe() {
        let mut out = Vec::new();
        let p2 = publish(2, 9);
        assert_eq!(handle(&p2, &mut out), Ok(p2.len()));
        assert_eq!(out, [0x50, 2, 0, 9]); // PUBREC
        out.clear();
        assert_eq!(handle(&[0x62, 2, 0, 9], &mut out), Ok(4));
        assert_eq!(out, [0x70, 2, 0, 9]); // PUBREL -> PUBCOMP
        out.clear();
        // SUBSCRIBE id 7 with filters "a" (QoS 0) and "bc" (QoS 1): SUBACK grants QoS 0 twice
        let sub = [0x82, 11, 0, 7, 0, 1, b'a', 0, 0, 2, b'b', b'c', 1];
        assert_eq!(handle(&sub, &mut out), Ok(sub.len()));
        assert_eq!(out, [mqtt::SUBACK, 4, 0, 7, 0, 0]);
        out.clear();
        let unsub = [0xA2, 5, 0, 8, 0, 1, b'a'];
        assert_eq!(handle(&unsub, &mut out), Ok(unsub.len()));
        assert_eq!(out, [0xB0, 2, 0, 8]);
    }

    #[test]
    fn partial_packets_are_left_for_the_next_read() {
        let one = publish(1, 5);
        let mut data = one.clone();
        data.extend_from_slice(&publish(1, 6)[..4]);
        let mut out = Vec::new();
        assert_eq!(handle(&data, &mut out), Ok(one.len()));
        assert_eq!(out, [mqtt::PUBACK, 2, 0, 5]);
        out.clear();
        assert_eq!(handle(&[], &mut out), Ok(0));
        assert!(out.is_empty());
    }

    #[test]
    fn disconnect_and_malformed() {
        let mut data = publish(1, 3);
        data.extend([mqtt::DISCONNECT, 0]);
        data.extend(publish(1, 4));
        let mut out = Vec::new();
        assert_eq!(handle(&data, &mut out), Err(true));
        assert_eq!(out, [mqtt::PUBACK, 2, 0, 3], "acks before the DISCONNECT are still sent");
        let mut out = Vec::new();
        assert_eq!(handle(&[mqtt::PUBLISH, 0xFF, 0xFF, 0xFF, 0xFF, 0x01], &mut out), Err(false));
        // a QoS 1 PUBLISH too short to hold its packet id gets no PUBACK (and no panic)
        let mut out = Vec::new();
        assert_eq!(handle(&[mqtt::PUBLISH | 2, 3, 0, 1, b't'], &mut out), Ok(5));
        assert!(out.is_empty());
    }
}
