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

/// CONNECT, clean session. An empty `username` sends none; `password` is sent only with a username (MQTT
/// 3.1.1 forbids a password without one), as Hono's adapters want (`<auth-id>@<tenant>` and its password).
pub fn connect(buf: &mut Vec<u8>, client_id: &str, username: &str, password: Option<&str>, keepalive: u16) {
    let password = if username.is_empty() { None } else { password };
    let mut body = Vec::with_capacity(16 + client_id.len() + username.len() + password.map_or(0, |p| 2 + p.len()));
    put_str(&mut body, b"MQTT");
    body.push(4); // protocol level 3.1.1
    let mut flags = 0x02u8; // clean session
    if !username.is_empty() {
        flags |= 0x80;
    }
    if password.is_some() {
        flags |= 0x40;
    }
    body.push(flags);
    body.extend_from_slice(&keepalive.to_be_bytes());
    put_str(&mut body, client_id.as_bytes());
    if !username.is_empty() {
        put_str(&mut body, username.as_bytes());
    }
    if let Some(p) = password {
        put_str(&mut body, p.as_bytes());
    }
    buf.push(CONNECT);
    put_len(buf, body.len());
    buf.extend_from_slice(&body);
}

/// What a CONNACK's return code means (MQTT 3.1.1, 3.2.2.3).
pub fn connack_reason(code: u8) -> &'static str {
    match code {
        0 => "accepted",
        1 => "unacceptable protocol version",
        2 => "identifier rejected",
        3 => "server unavailable",
        4 => "bad user name or password",
        5 => "not authorized",
        _ => "reserved",
    }
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

/// [`publish`] with the payload written straight into `buf` by `payload` (no copy through a payload
/// buffer): two bytes are left for the remaining length, the usual case (128..16,383 bytes), and patched
/// once the payload is there; any other length is re-encoded in place (a shift of the packet's tail).
#[inline]
pub fn publish_with(buf: &mut Vec<u8>, topic16: &[u8], qos: u8, mid: u16, payload: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[PUBLISH | (qos << 1), 0, 0]);
    buf.extend_from_slice(topic16);
    if qos > 0 {
        buf.extend_from_slice(&mid.to_be_bytes());
    }
    payload(buf);
    let n = buf.len() - start - 3;
    if (128..16_384).contains(&n) {
        buf[start + 1] = (n & 0x7F) as u8 | 0x80;
        buf[start + 2] = (n >> 7) as u8;
    } else {
        let mut len = Vec::with_capacity(4);
        put_len(&mut len, n);
        buf.splice(start + 1..start + 3, len);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn len_bytes(n: usize) -> Vec<u8> {
        let mut b = Vec::new();
        put_len(&mut b, n);
        b
    }

    fn topic16(t: &str) -> Vec<u8> {
        let mut v = (t.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(t.as_bytes());
        v
    }

    #[test]
    fn remaining_length_varint_matches_the_spec_table() {
        // MQTT 3.1.1 section 2.2.3: the edges of 1..4 byte encodings
        assert_eq!(len_bytes(0), [0x00]);
        assert_eq!(len_bytes(127), [0x7F]);
        assert_eq!(len_bytes(128), [0x80, 0x01]);
        assert_eq!(len_bytes(16_383), [0xFF, 0x7F]);
        assert_eq!(len_bytes(16_384), [0x80, 0x80, 0x01]);
        assert_eq!(len_bytes(2_097_151), [0xFF, 0xFF, 0x7F]);
        assert_eq!(len_bytes(2_097_152), [0x80, 0x80, 0x80, 0x01]);
        assert_eq!(len_bytes(268_435_455), [0xFF, 0xFF, 0xFF, 0x7F]);
    }

    #[test]
    fn frame_reads_back_what_put_len_wrote() {
        for n in [0usize, 1, 127, 128, 300, 16_383, 16_384, 70_000] {
            let mut b = vec![PUBLISH];
            put_len(&mut b, n);
            let hdr = b.len();
            b.resize(hdr + n, 0xAB);
            assert_eq!(frame(&b), Ok(Some((PUBLISH, hdr, hdr + n))), "n={n}");
            // one byte short: incomplete, never a wrong frame
            assert_eq!(frame(&b[..b.len() - 1]), Ok(None), "n={n}");
            // trailing bytes of the next packet are not part of this one
            b.extend_from_slice(&[PINGREQ, 0]);
            assert_eq!(frame(&b), Ok(Some((PUBLISH, hdr, hdr + n))));
        }
    }

    #[test]
    fn frame_incomplete_and_malformed() {
        assert_eq!(frame(&[]), Ok(None));
        assert_eq!(frame(&[PINGRESP]), Ok(None));
        assert_eq!(frame(&[PINGRESP, 0]), Ok(Some((PINGRESP, 2, 2))));
        assert_eq!(frame(&[PUBLISH, 0x80]), Ok(None)); // length continues
        assert_eq!(frame(&[PUBLISH, 0xFF, 0xFF, 0xFF, 0x7F]), Ok(None)); // 256 MB body not here yet
        // a fifth length byte is malformed ...
        assert_eq!(frame(&[PUBLISH, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]), Err(()));
        // ... but only once it has arrived: with 4 continuation bytes and nothing after them
        // frame() still waits (harmless: the next read turns it into the error)
        assert_eq!(frame(&[PUBLISH, 0xFF, 0xFF, 0xFF, 0xFF]), Ok(None));
    }

    #[test]
    fn connect_packet_bytes() {
        let mut b = Vec::new();
        connect(&mut b, "cid", "tok", None, 15);
        let want: Vec<u8> = [
            &[CONNECT, 20][..],
            &[0, 4, b'M', b'Q', b'T', b'T', 4, 0x82, 0, 15],
            &[0, 3, b'c', b'i', b'd'],
            &[0, 3, b't', b'o', b'k'],
        ]
        .concat();
        assert_eq!(b, want);
        // no username: no username flag, no username field
        let mut b = Vec::new();
        connect(&mut b, "c", "", None, 300);
        assert_eq!(b, [CONNECT, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0x01, 0x2C, 0, 1, b'c']);
        // a password after the username, with its flag (0x40)
        let mut b = Vec::new();
        connect(&mut b, "c", "u@t", Some("pw"), 60);
        let want: Vec<u8> = [
            &[CONNECT, 22][..],
            &[0, 4, b'M', b'Q', b'T', b'T', 4, 0xC2, 0, 60],
            &[0, 1, b'c'],
            &[0, 3, b'u', b'@', b't'],
            &[0, 2, b'p', b'w'],
        ]
        .concat();
        assert_eq!(b, want);
        assert_eq!(connack_reason(5), "not authorized");
        // no username: no password either (MQTT 3.1.1, 3.1.2.9)
        let mut b = Vec::new();
        connect(&mut b, "c", "", Some("pw"), 300);
        assert_eq!(b[9], 0x02);
    }

    #[test]
    fn publish_packet_bytes() {
        let t = topic16("a/b");
        let mut b = Vec::new();
        publish(&mut b, &t, 1, 0x1234, b"hi");
        assert_eq!(b, [PUBLISH | 2, 9, 0, 3, b'a', b'/', b'b', 0x12, 0x34, b'h', b'i']);
        let mut b = Vec::new();
        publish(&mut b, &t, 0, 0x1234, b"hi"); // QoS 0: no packet id
        assert_eq!(b, [PUBLISH, 7, 0, 3, b'a', b'/', b'b', b'h', b'i']);
        // appends, and a big payload gets a multi-byte length that frame() reads back
        let payload = vec![b'x'; 1000];
        publish(&mut b, &t, 1, 7, &payload);
        let rest = &b[9..];
        assert_eq!(frame(rest), Ok(Some((PUBLISH | 2, 3, 3 + 5 + 2 + 1000))));
        assert_eq!(&rest[3..8], &t[..]);
        assert_eq!(&rest[8..10], &[0, 7]);
    }

    #[test]
    fn publish_with_writes_what_publish_writes_at_every_length_encoding() {
        let t = topic16("v1/devices/me/telemetry");
        for n in [0usize, 1, 90, 100, 101, 102, 103, 200, 16_354, 16_355, 16_356, 70_000] {
            for qos in [0u8, 1] {
                let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
                let (mut a, mut b) = (vec![9u8, 9], vec![9u8, 9]); // appends after what is there
                publish(&mut a, &t, qos, 0xBEEF, &payload);
                publish_with(&mut b, &t, qos, 0xBEEF, |out| out.extend_from_slice(&payload));
                assert_eq!(a, b, "payload {n} bytes, qos {qos}");
            }
        }
    }
}
