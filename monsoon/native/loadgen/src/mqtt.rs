//! The handful of MQTT 3.1.1 packets the generator and the sink need (CONNECT/CONNACK,
//! PUBLISH/PUBACK, PINGREQ/PINGRESP, SUBSCRIBE/SUBACK, DISCONNECT), encoded straight into
//! per-connection byte buffers and parsed in place from the read buffer.
//!
//! Hand-written on purpose: `mqttbytes` is no longer released separately (its code lives on
//! inside rumqttc), and both decode into owned packet structs (a `Bytes`/`String` per topic
//! and payload), i.e. allocations and copies per message on the hot path, whose whole point
//! here is CPU per message. The generator needs to *write* one packet kind and *read* two;
//! that is the ~100 lines below (the fixed header's remaining-length varint is the only
//! subtle part, and the sink, the integration tests against Mosquitto and paho's sink-side
//! use cover it).
pub const CONNECT: u8 = 0x10;
pub const CONNACK: u8 = 0x20;
pub const PUBLISH: u8 = 0x30;
pub const PUBACK: u8 = 0x40;
pub const SUBSCRIBE: u8 = 0x80;
pub const SUBACK: u8 = 0x90;
pub const PINGREQ: u8 = 0xC0;
pub const PINGRESP: u8 = 0xD0;
pub const DISCONNECT: u8 = 0xE0;

#[inline]
pub fn put_len(buf: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n & 0x7F) as u8;
        n >>= 7;
        if n > 0 {
            b |= 0x80;
        }
        buf.push(b);
        if n == 0 {
            break;
        }
    }
}

fn put_str(buf: &mut Vec<u8>, s: &[u8]) {
    buf.extend_from_slice(&(s.len() as u16).to_be_bytes());
    buf.extend_from_slice(s);
}

pub fn connect(buf: &mut Vec<u8>, client_id: &str, username: &str, keepalive: u16) {
    let mut body = Vec::with_capacity(16 + client_id.len() + username.len());
    put_str(&mut body, b"MQTT");
    body.push(4); // protocol level 3.1.1
    let mut flags = 0x02u8; // clean session
    if !username.is_empty() {
        flags |= 0x80;
    }
    body.push(flags);
    body.extend_from_slice(&keepalive.to_be_bytes());
    put_str(&mut body, client_id.as_bytes());
    if !username.is_empty() {
        put_str(&mut body, username.as_bytes());
    }
    buf.push(CONNECT);
    put_len(buf, body.len());
    buf.extend_from_slice(&body);
}

/// `topic16` is the length-prefixed topic.
#[inline]
pub fn publish(buf: &mut Vec<u8>, topic16: &[u8], qos: u8, mid: u16, payload: &[u8]) {
    let n = topic16.len() + if qos > 0 { 2 } else { 0 } + payload.len();
    buf.push(PUBLISH | (qos << 1));
    put_len(buf, n);
    buf.extend_from_slice(topic16);
    if qos > 0 {
        buf.extend_from_slice(&mid.to_be_bytes());
    }
    buf.extend_from_slice(payload);
}

/// One packet at the front of `data`: Some((first byte, body range, total length)),
/// None if incomplete. Err if the remaining length is malformed.
#[inline]
pub fn frame(data: &[u8]) -> Result<Option<(u8, usize, usize)>, ()> {
    if data.len() < 2 {
        return Ok(None);
    }
    let mut len = 0usize;
    let mut mult = 1usize;
    let mut i = 1;
    loop {
        if i >= data.len() {
            return Ok(None);
        }
        if i > 4 {
            return Err(());
        }
        let b = data[i];
        len += (b & 0x7F) as usize * mult;
        mult <<= 7;
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    if data.len() < i + len {
        return Ok(None);
    }
    Ok(Some((data[0], i, i + len)))
}
