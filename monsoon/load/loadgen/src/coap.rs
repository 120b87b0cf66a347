//! CoAP (RFC 7252) messages: what the native Hono CoAP fleet and the DTLS sink send and read. Only what they
//! need: a header, a token, options in ascending order (Uri-Path, Content-Format, Uri-Query, Location-Path), a
//! payload.

pub const CON: u8 = 0;
pub const NON: u8 = 1;
pub const ACK: u8 = 2;
pub const RST: u8 = 3;

pub const GET: u8 = 0x01;
pub const POST: u8 = 0x02;
pub const EMPTY: u8 = 0x00;
pub const CHANGED: u8 = 0x44; // 2.04
pub const CONTENT: u8 = 0x45; // 2.05
#[allow(dead_code)]
pub const NOT_FOUND: u8 = 0x84; // 4.04

pub const OPT_LOCATION_PATH: u16 = 8;
pub const OPT_URI_PATH: u16 = 11;
pub const OPT_CONTENT_FORMAT: u16 = 12;
pub const OPT_URI_QUERY: u16 = 15;

/// `c.dd` of a code byte (class in the top 3 bits): 0x44 -> "2.04".
pub fn dotted(code: u8) -> String {
    format!("{}.{:02}", code >> 5, code & 0x1f)
}

/// A 2.xx code.
pub fn is_success(code: u8) -> bool {
    code >> 5 == 2
}

fn ext(n: usize) -> (u8, usize, usize) {
    // (nibble, extension length, extension value)
    if n < 13 {
        (n as u8, 0, 0)
    } else if n < 269 {
        (13, 1, n - 13)
    } else {
        (14, 2, n - 269)
    }
}

fn put_ext(out: &mut Vec<u8>, len: usize, v: usize) {
    if len == 1 {
        out.push(v as u8);
    } else if len == 2 {
        out.extend_from_slice(&(v as u16).to_be_bytes());
    }
}

/// Appends options to a message; each `opt` call must have a number >= the previous one's.
pub struct Builder<'a> {
    out: &'a mut Vec<u8>,
    last: u16,
}

impl<'a> Builder<'a> {
    /// The 4-byte header and the token (at most 8 bytes).
    pub fn new(out: &'a mut Vec<u8>, typ: u8, code: u8, mid: u16, token: &[u8]) -> Self {
        debug_assert!(token.len() <= 8);
        out.push(0x40 | (typ << 4) | token.len() as u8);
        out.push(code);
        out.extend_from_slice(&mid.to_be_bytes());
        out.extend_from_slice(token);
        Builder { out, last: 0 }
    }

    pub fn opt(&mut self, num: u16, val: &[u8]) -> &mut Self {
        debug_assert!(num >= self.last);
        let (dn, dl, dv) = ext((num - self.last) as usize);
        let (ln, ll, lv) = ext(val.len());
        self.out.push((dn << 4) | ln);
        put_ext(self.out, dl, dv);
        put_ext(self.out, ll, lv);
        self.out.extend_from_slice(val);
        self.last = num;
        self
    }

    /// Uri-Path options of a path `a/b/c` (no leading slash needed).
    pub fn path(&mut self, num: u16, path: &str) -> &mut Self {
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            self.opt(num, seg.as_bytes());
        }
        self
    }

    /// A Content-Format (or any uint) option, in the fewest bytes.
    pub fn uint(&mut self, num: u16, v: u32) -> &mut Self {
        let b = v.to_be_bytes();
        let skip = b.iter().take_while(|x| **x == 0).count();
        self.opt(num, &b[skip..])
    }

    pub fn payload(&mut self, p: &[u8]) {
        if !p.is_empty() {
            self.out.push(0xff);
            self.out.extend_from_slice(p);
        }
    }
}

/// A parsed message, borrowing from its datagram.
#[derive(Debug, PartialEq)]
pub struct Msg<'a> {
    pub typ: u8,
    pub code: u8,
    pub mid: u16,
    pub token: &'a [u8],
    pub opts: Vec<(u16, &'a [u8])>,
    pub payload: &'a [u8],
}

impl<'a> Msg<'a> {
    pub fn parse(b: &'a [u8]) -> Result<Msg<'a>, &'static str> {
        if b.len() < 4 {
            return Err("short header");
        }
        if b[0] >> 6 != 1 {
            return Err("not CoAP version 1");
        }
        let tkl = (b[0] & 0x0f) as usize;
        if tkl > 8 || b.len() < 4 + tkl {
            return Err("bad token length");
        }
        let mut m = Msg {
            typ: (b[0] >> 4) & 3,
            code: b[1],
            mid: u16::from_be_bytes([b[2], b[3]]),
            token: &b[4..4 + tkl],
            opts: Vec::new(),
            payload: &[],
        };
        let mut i = 4 + tkl;
        let mut num: u32 = 0;
        while i < b.len() {
            if b[i] == 0xff {
                if i + 1 == b.len() {
                    return Err("payload marker without payload");
                }
                m.payload = &b[i + 1..];
                break;
            }
            let (dn, ln) = ((b[i] >> 4) as usize, (b[i] & 0x0f) as usize);
            i += 1;
            let mut read = |n: usize| -> Result<usize, &'static str> {
                match n {
                    13 => {
                        let v = *b.get(i).ok_or("truncated option")? as usize + 13;
                        i += 1;
                        Ok(v)
                    }
                    14 => {
                        if i + 2 > b.len() {
                            return Err("truncated option");
                        }
                        let v = u16::from_be_bytes([b[i], b[i + 1]]) as usize + 269;
                        i += 2;
                        Ok(v)
                    }
                    15 => Err("reserved option nibble"),
                    n => Ok(n),
                }
            };
            let delta = read(dn)?;
            let len = read(ln)?;
            num += delta as u32;
            if num > u16::MAX as u32 || i + len > b.len() {
                return Err("truncated option");
            }
            m.opts.push((num as u16, &b[i..i + len]));
            i += len;
        }
        Ok(m)
    }

    /// The values of option `num`, in order.
    pub fn opt_all(&self, num: u16) -> impl Iterator<Item = &'a [u8]> + '_ {
        self.opts.iter().filter(move |(n, _)| *n == num).map(|(_, v)| *v)
    }

    /// Option `num`'s values joined by `/` (a path).
    #[allow(dead_code)]
    pub fn path(&self, num: u16) -> String {
        let parts: Vec<String> = self.opt_all(num).map(|v| String::from_utf8_lossy(v).into_owned()).collect();
        parts.join("/")
    }
}

/// An empty message (an ACK or RST of `mid`).
pub fn empty(out: &mut Vec<u8>, typ: u8, mid: u16) {
    Builder::new(out, typ, EMPTY, mid, &[]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let mut b = Vec::new();
        Builder::new(&mut b, CON, POST, 0x1234, &[1, 2, 3, 4])
            .path(OPT_URI_PATH, "command_response/req-17")
            .uint(OPT_CONTENT_FORMAT, 50)
            .opt(OPT_URI_QUERY, b"hono-cmd-status=200")
            .payload(b"{\"done\": true}");
        assert_eq!(&b[..4], &[0x44, 0x02, 0x12, 0x34]);
        let m = Msg::parse(&b).unwrap();
        assert_eq!((m.typ, m.code, m.mid, m.token), (CON, POST, 0x1234, &[1u8, 2, 3, 4][..]));
        assert_eq!(m.path(OPT_URI_PATH), "command_response/req-17");
        assert_eq!(m.opt_all(OPT_CONTENT_FORMAT).next(), Some(&[50u8][..]));
        assert_eq!(m.path(OPT_URI_QUERY), "hono-cmd-status=200");
        assert_eq!(m.payload, b"{\"done\": true}");
    }

    #[test]
    fn long_options_and_deltas() {
        let long = vec![b'x'; 300];
        let mid = vec![b'y'; 20];
        let mut b = Vec::new();
        Builder::new(&mut b, NON, POST, 7, &[]).opt(OPT_LOCATION_PATH, &mid).opt(OPT_URI_PATH, &long).opt(300, b"z");
        let m = Msg::parse(&b).unwrap();
        assert_eq!(m.opts, vec![(OPT_LOCATION_PATH, &mid[..]), (OPT_URI_PATH, &long[..]), (300, &b"z"[..])]);
        assert!(m.payload.is_empty());
    }

    #[test]
    fn empty_ack_and_codes() {
        let mut b = Vec::new();
        empty(&mut b, ACK, 99);
        assert_eq!(b, vec![0x60, 0, 0, 99]);
        let m = Msg::parse(&b).unwrap();
        assert_eq!((m.typ, m.code, m.mid), (ACK, EMPTY, 99));
        assert_eq!(dotted(CHANGED), "2.04");
        assert_eq!(dotted(0xa3), "5.03");
        assert!(is_success(CONTENT) && !is_success(0xa3) && !is_success(NOT_FOUND));
    }

    #[test]
    fn malformed_is_an_error() {
        assert!(Msg::parse(&[0x40, 1]).is_err());
        assert!(Msg::parse(&[0x80, 1, 0, 0]).is_err()); // version 2
        assert!(Msg::parse(&[0x49, 1, 0, 0]).is_err()); // token length 9
        assert!(Msg::parse(&[0x40, 1, 0, 0, 0xb5, b'a']).is_err()); // option longer than the message
        assert!(Msg::parse(&[0x40, 1, 0, 0, 0xff]).is_err());
    }
}
