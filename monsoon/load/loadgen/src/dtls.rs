//! DTLS 1.2 with a pre-shared key over OpenSSL (the `openssl` crate): the contexts of the native CoAP fleet
//! (client) and of monsoon's DTLS sink (server), the datagram I/O under each session, and the DTLS retransmit
//! timer (which the crate does not wrap: `SSL_ctrl` DTLS_CTRL_GET_TIMEOUT / DTLS_CTRL_HANDLE_TIMEOUT).
use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslMethod, SslMode, SslOptions, SslVerifyMode};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

/// The PSK cipher suites offered and accepted: Hono's CoAP adapter (Californium) and tinydtls (aiocoap) speak
/// TLS_PSK_WITH_AES_128_CCM_8; the others are for peers that prefer them.
pub const CIPHERS: &str = "PSK-AES128-CCM8:PSK-AES128-GCM-SHA256:PSK-AES128-CBC-SHA256:@SECLEVEL=0";
/// The record MTU set on every session (no path-MTU query: the custom BIO has none).
pub const MTU: u32 = 1400;

/// A device's PSK identity and key, kept in its `Ssl` for the client callback.
pub struct Psk {
    pub identity: Vec<u8>,
    pub key: Vec<u8>,
}

/// The key monsoon provisions for a device secret (`monsoon.stack.provision.psk_key`): SHA-256, first 16 bytes.
pub fn psk_key(secret: &str) -> Vec<u8> {
    openssl::sha::sha256(secret.as_bytes())[..16].to_vec()
}

fn common(b: &mut SslContextBuilder) -> Result<(), ErrorStack> {
    b.set_cipher_list(CIPHERS)?;
    b.set_options(SslOptions::NO_QUERY_MTU | SslOptions::NO_TICKET);
    b.set_mode(SslMode::RELEASE_BUFFERS);
    b.set_verify(SslVerifyMode::NONE);
    Ok(())
}

/// The client context: each `Ssl` made from it carries its device's [`Psk`] under the returned index.
pub fn client_context() -> Result<(SslContext, Index<Ssl, Psk>), ErrorStack> {
    let idx = Ssl::new_ex_index::<Psk>()?;
    let mut b = SslContext::builder(SslMethod::dtls_client())?;
    common(&mut b)?;
    b.set_psk_client_callback(move |ssl, _hint, id_buf, key_buf| {
        let psk = ssl.ex_data(idx).ok_or_else(ErrorStack::get)?;
        if psk.identity.len() + 1 > id_buf.len() || psk.key.len() > key_buf.len() {
            return Err(ErrorStack::get());
        }
        id_buf[..psk.identity.len()].copy_from_slice(&psk.identity);
        id_buf[psk.identity.len()] = 0; // OpenSSL reads the identity as a C string
        key_buf[..psk.key.len()].copy_from_slice(&psk.key);
        Ok(psk.key.len())
    });
    Ok((b.build(), idx))
}

/// The server context: a client's identity must be in `keys` (identity -> key), else the handshake fails.
pub fn server_context(keys: HashMap<Vec<u8>, Vec<u8>>) -> Result<SslContext, ErrorStack> {
    let mut b = SslContext::builder(SslMethod::dtls_server())?;
    common(&mut b)?;
    b.set_psk_server_callback(move |_ssl, identity, key_buf| match identity.and_then(|i| keys.get(i)) {
        Some(k) if k.len() <= key_buf.len() => {
            key_buf[..k.len()].copy_from_slice(k);
            Ok(k.len())
        }
        _ => Ok(0), // unknown identity: no key, the handshake fails
    });
    Ok(b.build())
}

/// A new session's `Ssl` with the fixed MTU.
pub fn new_ssl(ctx: &SslContext) -> Result<Ssl, ErrorStack> {
    let mut ssl = Ssl::new(ctx)?;
    ssl.set_mtu(MTU)?;
    Ok(ssl)
}

const DTLS_CTRL_GET_TIMEOUT: libc::c_int = 73;
const DTLS_CTRL_HANDLE_TIMEOUT: libc::c_int = 74;

/// Time left on the session's DTLS retransmit timer (None: not running, i.e. no flight awaits an answer).
pub fn timeout(ssl: &openssl::ssl::SslRef) -> Option<Duration> {
    use foreign_types::ForeignTypeRef;
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let r = unsafe {
        openssl_sys::SSL_ctrl(ssl.as_ptr(), DTLS_CTRL_GET_TIMEOUT, 0, &mut tv as *mut libc::timeval as *mut libc::c_void)
    };
    (r == 1).then(|| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000))
}

/// Retransmit the last flight if its timer ran out (DTLSv1_handle_timeout); > 0: it did.
pub fn handle_timeout(ssl: &openssl::ssl::SslRef) -> i64 {
    use foreign_types::ForeignTypeRef;
    unsafe { openssl_sys::SSL_ctrl(ssl.as_ptr(), DTLS_CTRL_HANDLE_TIMEOUT, 0, std::ptr::null_mut()) as i64 }
}

/// A device's own connected UDP socket under its session: a read is one datagram, a write one datagram.
pub struct UdpIo(pub mio::net::UdpSocket);

impl Read for UdpIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.recv(buf)
    }
}

impl Write for UdpIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.send(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A server session's I/O: the datagrams the shared socket received from its peer, and writes sent back to it.
pub struct PeerIo {
    pub inbox: VecDeque<Vec<u8>>,
    pub sock: Rc<std::net::UdpSocket>,
    pub peer: SocketAddr,
}

impl Read for PeerIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inbox.pop_front() {
            Some(d) => {
                let n = d.len().min(buf.len());
                buf[..n].copy_from_slice(&d[..n]);
                Ok(n)
            }
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Write for PeerIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.sock.send_to(buf, self.peer) {
            Ok(n) => Ok(n),
            // a full socket buffer drops the datagram, as the network would: DTLS and CoAP retransmit
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(buf.len()),
            Err(e) => Err(e),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
