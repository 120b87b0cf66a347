//! `monsoon-loadgen floor`: the physical floor of the engine's benchmark, the cost of the loopback
//! transport alone. `connections` blocking sockets each write `batch` pre-encoded QoS 1 PUBLISHes
//! (the engine's minimal 146-byte payload, built once) in one write, then read until the sink has
//! acked all of them; round after round until `messages` are acked. No schedule, no payload work,
//! no accounting, no epoll: one write and as few reads as the kernel allows per batch. Prints one
//! JSON line with its CPU (getrusage, the publish phase only) per acked message.
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

pub fn run(port: u16, connections: usize, messages: u64, batch: usize) -> Result<i32, String> {
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
    let buf = batch_bytes("v1/devices/me/telemetry", batch);
    let want = 4 * batch; // PUBACKs: 4 bytes each
    let mut rbuf = vec![0u8; 1 << 16];
    let (mut acked, mut writes, mut reads) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    let c0 = cpu_s();
    while acked < messages {
        for s in socks.iter_mut() {
            s.write_all(&buf).map_err(|e| format!("floor: write: {e}"))?;
            writes += 1;
        }
        for s in socks.iter_mut() {
            let mut got = 0;
            while got < want {
                let n = s.read(&mut rbuf[..want - got]).map_err(|e| format!("floor: read: {e}"))?;
                if n == 0 {
                    return Err("floor: the sink closed the connection".into());
                }
                reads += 1;
                got += n;
            }
            acked += batch as u64;
        }
    }
    let cpu = cpu_s() - c0;
    let elapsed = t0.elapsed().as_secs_f64();
    for s in socks.iter_mut() {
        let _ = s.write_all(&[mqtt::DISCONNECT, 0]);
    }
    println!("{}", json!({"floor": {
        "messages": acked, "connections": socks.len(), "batch": batch, "payload_bytes": payload_len(),
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
        assert_eq!(run(port, 3, 3000, 7), Ok(0));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        h.join().unwrap().unwrap();
    }
}
