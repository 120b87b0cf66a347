//! `monsoon-loadgen floor`: the physical floor of the engine's benchmark, the cost of the loopback
//! transport alone. `connections` blocking sockets each write `batch` pre-encoded QoS 1 PUBLISHes
//! (the engine's minimal 146-byte payload, built once) in one write, then read until the sink has
//! acked all of them; round after round until `messages` are acked. No schedule, no payload work,
//! no accounting, no epoll: one write and as few reads as the kernel allows per batch. Prints one
//! JSON line with its CPU (getrusage, the publish phase only) per acked message.
//!
//! Paced (`--rate R`, with `--tick-ms T`, default 5, the engine's default tick): the same floor on the
//! engine's clock. It sleeps to each tick, writes what the rate made due since the start, spread over the
//! connections (each connection's share in one write), and reads their acks; so it pays what pacing costs
//! (a wake-up per tick, with caches gone cold between ticks), and nothing of monsoon's own work.
use crate::gen::cpu_s;
use crate::mqtt;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

fn payload_len() -> usize {
    PAYLOAD.len()
}

const PAYLOAD: &[u8] = br#"{"ts":1700000000000,"values":{"device":"floor-000000","seq":1234567,"sent_ms":1700000000001,"temperature":20.5,"humidity":35},"pad":"xxxxxxxxxxx"}"#;

/// `batch` QoS 1 PUBLISHes of a 146-byte payload, packet ids 1..=batch, as one buffer.
pub fn batch_bytes(topic: &str, batch: usize) -> Vec<u8> {
    let mut t16 = (topic.len() as u16).to_be_bytes().to_vec();
    t16.extend_from_slice(topic.as_bytes());
    // the engine's minimal payload's shape, padded to 146 bytes
    let payload = PAYLOAD;
    let mut out = Vec::with_capacity(batch * (payload.len() + t16.len() + 5));
    for i in 0..batch {
        mqtt::publish(&mut out, &t16, 1, (i % 65535 + 1) as u16, payload);
    }
    out
}

pub fn run(port: u16, connections: usize, messages: u64, batch: usize, rate: f64, tick_ms: f64) -> Result<i32, String> {
    crate::gen::raise_nofile_pub();
    let batch = batch.clamp(1, 65535);
    let addr = format!("127.0.0.1:{port}");
    let mut socks = Vec::with_capacity(connections);
    for i in 0..connections.max(1) {
        let mut s = TcpStream::connect(&addr).map_err(|e| format!("floor: connect {addr}: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut b = Vec::new();
        mqtt::connect(&mut b, &format!("floor-{i:06}"), "", None, 60);
        s.write_all(&b).map_err(|e| e.to_string())?;
        let mut ack = [0u8; 4];
        s.read_exact(&mut ack).map_err(|e| format!("floor: CONNACK: {e}"))?;
        if ack[0] != mqtt::CONNACK || ack[3] != 0 {
            return Err(format!("floor: connection refused: {ack:?}"));
        }
        socks.push(s);
    }
    let paced = rate > 0.0;
    let tick = std::time::Duration::from_secs_f64(tick_ms.max(0.1) / 1000.0);
    // paced: a tick's share of one connection can exceed --batch; the buffer holds the most a tick can ask
    let mut most = if paced { ((rate * tick.as_secs_f64() / socks.len() as f64).ceil() as usize + 1).clamp(1, 65535) } else { batch };
    let mut buf = batch_bytes("v1/devices/me/telemetry", most);
    let pkt = buf.len() / most; // every publish is the same size
    let mut rbuf = vec![0u8; 1 << 16];
    let (mut acked, mut writes, mut reads, mut ticks) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    let c0 = cpu_s();
    let mut per = vec![batch; socks.len()]; // how many publishes each connection writes this round
    while acked < messages {
        if paced {
            ticks += 1;
            let next = t0 + tick * ticks as u32;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
            let due = ((t0.elapsed().as_secs_f64() * rate) as u64).min(messages).saturating_sub(acked) as usize;
            let n = socks.len();
            for (i, p) in per.iter_mut().enumerate() {
                *p = due / n + usize::from(i < due % n);
            }
            let need = per[0].min(65535); // a late tick: more was due than a tick's share; never left behind
            if need > most {
                most = need;
                buf = batch_bytes("v1/devices/me/telemetry", most);
            }
            for p in per.iter_mut() {
                *p = (*p).min(most);
            }
        }
        for (s, &k) in socks.iter_mut().zip(&per) {
            if k == 0 {
                continue;
            }
            s.write_all(&buf[..k * pkt]).map_err(|e| format!("floor: write: {e}"))?;
            writes += 1;
        }
        for (s, &k) in socks.iter_mut().zip(&per) {
            let want = 4 * k; // PUBACKs: 4 bytes each
            let mut got = 0;
            while got < want {
                let n = s.read(&mut rbuf[..(want - got).min(1 << 16)]).map_err(|e| format!("floor: read: {e}"))?;
                if n == 0 {
                    return Err("floor: the sink closed the connection".into());
                }
                reads += 1;
                got += n;
            }
            acked += k as u64;
        }
    }
    let cpu = cpu_s() - c0;
    let elapsed = t0.elapsed().as_secs_f64();
    for s in socks.iter_mut() {
        let _ = s.write_all(&[mqtt::DISCONNECT, 0]);
    }
    println!("{}", json!({"floor": {
        "messages": acked, "connections": socks.len(), "payload_bytes": payload_len(),
        "batch": if paced { if writes > 0 { acked as f64 / writes as f64 } else { 0.0 } } else { batch as f64 },
        "rate": rate, "tick_ms": if paced { tick_ms } else { 0.0 }, "ticks": ticks,
        "cpu_s": cpu, "elapsed_s": elapsed, "writes": writes, "reads": reads,
        "cpu_us_per_msg": if acked > 0 { cpu / acked as f64 * 1e6 } else { 0.0 },
    }}));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_that_many_qos1_publishes_of_146_bytes() {
        let b = batch_bytes("v1/devices/me/telemetry", 3);
        let mut pos = 0;
        let mut ids = Vec::new();
        while pos < b.len() {
            let (h, hdr, end) = mqtt::frame(&b[pos..]).unwrap().unwrap();
            assert_eq!(h, mqtt::PUBLISH | 2);
            let body = &b[pos + hdr..pos + end];
            let tl = u16::from_be_bytes([body[0], body[1]]) as usize;
            assert_eq!(&body[2..2 + tl], b"v1/devices/me/telemetry");
            ids.push(u16::from_be_bytes([body[2 + tl], body[3 + tl]]));
            assert_eq!(body.len() - 4 - tl, 146, "payload bytes");
            pos += end;
        }
        assert_eq!(ids, [1, 2, 3]);
    }

    #[test]
    fn floor_against_a_real_sink_counts_every_ack() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let l = crate::sink::listener(0).unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let h = std::thread::spawn(move || crate::sink::serve(l, st));
        assert_eq!(run(port, 3, 3000, 7, 0.0, 5.0), Ok(0));
        assert_eq!(run(port, 3, 3000, 7, 20_000.0, 5.0), Ok(0)); // paced: 0.15 s of ticks
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        h.join().unwrap().unwrap();
    }
}
