//! One TLS connection on rustls' unbuffered API, behind the few calls the proxy makes: feed it received bytes (records are decrypted in place in the caller's buffer and handed out as slices), take what it wants sent, encrypt a reply, close with `close_notify`. The same code drives a server side ([`Session`]) and a client side ([`crate::client::ClientSession`]); rustls' next major version replaces the unbuffered API, and only this file and `client.rs` know it.

use std::ops::DerefMut;
use std::sync::Arc;

use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncryptError, ReadEarlyData, UnbufferedConnectionCommon,
    UnbufferedStatus,
};
use rustls::ServerConfig;

/// What went wrong, classed as the metrics count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The peer sent an alert, or broke the protocol (rustls' reason).
    Alert(String),
    /// No certificate answers the client's SNI.
    NoCert,
    /// A ClientHello or record rustls cannot decode.
    BadHello(String),
    /// A client side refused the server's certificate (`reason` is the
    /// metric label: `unknown_ca`, `bad_name`, `bad_certificate`).
    Refused {
        reason: &'static str,
        detail: String,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Alert(e) => write!(f, "TLS error: {e}"),
            Failure::NoCert => f.write_str("no certificate for the client's SNI"),
            Failure::BadHello(e) => write!(f, "bad ClientHello: {e}"),
            Failure::Refused { detail, .. } => write!(f, "certificate refused: {detail}"),
        }
    }
}

fn classify(e: rustls::Error, handshaking: bool) -> Failure {
    if let rustls::Error::InvalidCertificate(c) = &e {
        use rustls::CertificateError as C;
        let reason = match c {
            C::UnknownIssuer => "unknown_ca",
            C::NotValidForName | C::NotValidForNameContext { .. } => "bad_name",
            _ => "bad_certificate",
        };
        return Failure::Refused {
            reason,
            detail: e.to_string(),
        };
    }
    match e {
        rustls::Error::General(m) if m.contains("no server certificate chain resolved") => {
            Failure::NoCert
        }
        rustls::Error::InvalidMessage(m) if handshaking => Failure::BadHello(format!("{m:?}")),
        other => Failure::Alert(other.to_string()),
    }
}

/// What the negotiation settled, for the access log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: &'static str,
    /// The IANA name of the cipher suite.
    pub cipher: &'static str,
    pub alpn: Option<Vec<u8>>,
    pub resumed: bool,
}

/// What a [`Session::read`] saw besides application data.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the input the session is done with; the caller drops them
    /// from the front before the next read (a partial record stays).
    pub consumed: usize,
    /// The handshake is complete: application data may flow both ways.
    pub established: bool,
    /// The peer sent `close_notify`: no more data will come.
    pub peer_closed: bool,
}

/// The side of a connection: what differs between rustls' unbuffered server
/// and client (the rest of [`Tls`] is the same code).
pub trait Side: DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> {
    type Data;
    /// `process_tls_records` of this side.
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    /// Early data arrived: its records are dropped; how many bytes.
    fn skip_early(r: ReadEarlyData<'_, '_, Self::Data>) -> Result<usize, Failure>;
}

impl Side for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(incoming)
    }
    fn skip_early(mut r: ReadEarlyData<'_, '_, ServerConnectionData>) -> Result<usize, Failure> {
        // max_early_data_size is 0: rustls refuses early data, so nothing
        // should arrive here; drop it if it does.
        let mut discard = 0;
        while let Some(rec) = r.next_record() {
            discard += rec.map_err(|e| Failure::Alert(e.to_string()))?.discard;
        }
        Ok(discard)
    }
}

/// A TLS connection of either side.
pub struct Tls<S> {
    conn: S,
    /// TLS bytes to send (handshake records, alerts, encrypted data), in
    /// order; freed when sent so an idle session holds no buffer.
    out: Vec<u8>,
    sent: usize,
    established: bool,
}

/// A record adds at most this much to its payload (TLS 1.2 AES-GCM: 5
/// header + 8 explicit nonce + 16 tag; TLS 1.3: 5 + 1 type + 16).
pub const RECORD_OVERHEAD: usize = 29;
/// The most plaintext per record (RFC 8446 §5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;

/// The server side's rustls connection (the `S` of a server [`Tls`]).
pub type ServerSide = UnbufferedServerConnection;

/// A server-side TLS connection.
pub type Session = Tls<ServerSide>;

impl Session {
    pub fn new(config: Arc<ServerConfig>) -> Result<Session, Failure> {
        let conn =
            UnbufferedServerConnection::new(config).map_err(|e| Failure::Alert(e.to_string()))?;
        Ok(Tls::with(conn))
    }
}

impl<S: Side> Tls<S> {
    pub(crate) fn with(conn: S) -> Tls<S> {
        Tls {
            conn,
            out: Vec::new(),
            sent: 0,
            established: false,
        }
    }

    /// Processes the TLS bytes in `incoming`: handshake messages move the
    /// negotiation on (their answers queue in [`Session::pending`]);
    /// application data is decrypted in place and each record's payload
    /// handed to `data`. On failure the alert TLS calls for is queued.
    pub fn read(
        &mut self,
        incoming: &mut [u8],
        data: &mut dyn FnMut(&[u8]),
    ) -> Result<Progress, Failure> {
        let mut p = Progress::default();
        let mut refused_renegotiation = false;
        loop {
            let UnbufferedStatus { mut discard, state } =
                self.conn.process(&mut incoming[p.consumed..]);
            let state = match state {
                Ok(s) => s,
                Err(e) => {
                    let handshaking = !self.established;
                    self.flush_alerts();
                    return Err(classify(e, handshaking));
                }
            };
            let mut stop = false;
            match state {
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(rec) = r.next_record() {
                        let rec = rec.map_err(|e| Failure::Alert(e.to_string()))?;
                        discard += rec.discard;
                        data(rec.payload);
                    }
                }
                ConnectionState::ReadEarlyData(r) => discard += S::skip_early(r)?,
                ConnectionState::EncodeTlsData(mut e) => {
                    encode_into(&mut self.out, |b| e.encode(b));
                    // On an established TLS 1.2 session the one message
                    // rustls answers by itself is a renegotiation request
                    // (its `no_renegotiation` warning, RFC 5746 §4.2).
                    refused_renegotiation = self.established;
                }
                ConnectionState::TransmitTlsData(t) => {
                    // Queued in `out`, which the caller sends before
                    // anything it encrypts later: that is the transmit.
                    t.done();
                }
                ConnectionState::BlockedHandshake => stop = true,
                ConnectionState::WriteTraffic(_) => {
                    self.established = true;
                    stop = true;
                }
                ConnectionState::PeerClosed => p.peer_closed = true,
                ConnectionState::Closed => {
                    p.peer_closed = true;
                    stop = true;
                }
                _ => stop = true,
            }
            p.consumed += discard;
            if refused_renegotiation && self.version_is_12() {
                // A client that asked waits for a ServerHello that never
                // comes: close the connection as nginx does, after the
                // warning (CVE-2009-3555 is why nobody renegotiates).
                return Err(Failure::Alert(
                    "renegotiation refused (no_renegotiation sent)".into(),
                ));
            }
            if stop {
                break;
            }
        }
        p.established = self.established;
        Ok(p)
    }

    fn version_is_12(&self) -> bool {
        let c: &rustls::CommonState = &self.conn;
        c.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_2)
    }

    /// After an error: the alert rustls queued (one chunk), into `out`.
    /// Called once: a further call would deframe, and with handshake
    /// messages of the failed flight still held (a server's whole flight
    /// arrives in one record) rustls would look for them in the empty
    /// buffer passed here, and panic (`client_tests` has the case).
    fn flush_alerts(&mut self) {
        let st = self.conn.process(&mut []);
        if let Ok(ConnectionState::EncodeTlsData(mut e)) = st.state {
            encode_into(&mut self.out, |b| e.encode(b))
        }
    }

    /// Encrypts `plain` into [`Session::pending`] (in records of at most
    /// 16 KiB). Fails before the handshake is complete or after a close.
    pub fn write(&mut self, plain: &[u8]) -> Result<(), Failure> {
        seal(&mut self.conn, plain, &mut self.out)
    }

    /// Encrypts `plain` onto the end of `dst`, a buffer the caller owns
    /// (a large reply's, so the session keeps no large buffer): what
    /// [`Session::pending`] held goes first, so the order on the wire stays.
    pub fn write_into(&mut self, plain: &[u8], dst: &mut Vec<u8>) -> Result<(), Failure> {
        let waiting = self.pending().len();
        if waiting > 0 {
            dst.extend_from_slice(self.pending());
            self.sent(waiting);
        }
        seal(&mut self.conn, plain, dst)
    }

    /// [`Session::write_into`] over a scratch buffer: `dst`'s bytes are
    /// overwritten from its start (a pooled send buffer's last contents), so
    /// the records are encrypted into bytes already initialised and only
    /// what they need past `dst.len()` is zero-filled first; `dst` ends
    /// holding exactly the bytes to send. A 16 KiB answer into the buffer of
    /// the last one zero-fills nothing (it zero-filled its two records' 16.5
    /// KiB each, about 0.4 µs a request here).
    pub fn write_over(&mut self, plain: &[u8], dst: &mut Vec<u8>) -> Result<(), Failure> {
        let mut at = 0;
        let waiting = self.pending().len();
        if waiting > 0 {
            put_at(dst, &mut at, self.pending());
            self.sent(waiting);
        }
        let r = seal_at(&mut self.conn, plain, dst, &mut at);
        dst.truncate(at);
        r
    }

    /// Queues `close_notify` (RFC 8446 §6.1) when the handshake finished;
    /// every close zgix starts on an established session sends one.
    pub fn close(&mut self) {
        let st = self.conn.process(&mut []);
        if let Ok(ConnectionState::WriteTraffic(mut w)) = st.state {
            let _ = encrypt_into(&mut self.out, 0, |b| w.queue_close_notify(b));
        }
    }

    /// Takes the TLS bytes waiting to be sent, to send them from a buffer
    /// the caller owns across its await; [`Session::give_back`] returns the
    /// allocation once sent.
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.out);
        out.drain(..self.sent);
        self.sent = 0;
        out
    }

    /// Returns a sent buffer's allocation for the next output (kept only
    /// if small: an idle session holds no big buffer).
    pub fn give_back(&mut self, mut buf: Vec<u8>) {
        if self.out.is_empty() && buf.capacity() <= 4096 {
            buf.clear();
            self.out = buf;
        }
    }

    /// Lends the session `buf` (empty; a pooled one) for the output to
    /// come, when nothing waits to be sent: a handshake's flights then
    /// grow no buffer of their own. Returns the buffer not used.
    pub fn lend_output(&mut self, mut buf: Vec<u8>) -> Vec<u8> {
        if self.sent == self.out.len() {
            buf.clear();
            self.sent = 0;
            std::mem::swap(&mut self.out, &mut buf);
        }
        buf
    }

    /// Puts `bytes` (output taken with [`Session::take_output`] and not
    /// sent) back in front of the output to come, to go out with it: a
    /// TLS 1.3 session ticket held for the first answer's write.
    pub fn hold(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(bytes.len() + self.pending().len());
        out.extend_from_slice(bytes);
        out.extend_from_slice(self.pending());
        self.out = out;
        self.sent = 0;
    }

    /// TLS bytes waiting to be sent.
    pub fn pending(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    /// `n` bytes of [`Session::pending`] went out.
    pub fn sent(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.out.len());
        if self.sent == self.out.len() {
            self.sent = 0;
            self.out.clear();
            // An idle session keeps no send buffer: a handshake's flight
            // is a few KiB, an encrypted body up to 16 KiB a record.
            if self.out.capacity() > 4096 {
                self.out = Vec::new();
            }
        }
    }

    pub fn is_established(&self) -> bool {
        self.established
    }

    /// The negotiated parameters (empty before the handshake is done).
    pub fn info(&self) -> Info {
        let c: &rustls::CommonState = &self.conn;
        Info {
            version: match c.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "",
            },
            cipher: c
                .negotiated_cipher_suite()
                .and_then(|s| s.suite().as_str())
                .unwrap_or(""),
            alpn: c.alpn_protocol().map(<[u8]>::to_vec),
            resumed: matches!(c.handshake_kind(), Some(rustls::HandshakeKind::Resumed)),
        }
    }
}

/// Encrypts `plain` onto the end of `out`, in records of at most 16 KiB.
fn seal<S: Side>(conn: &mut S, plain: &[u8], out: &mut Vec<u8>) -> Result<(), Failure> {
    let mut at = out.len();
    let r = seal_at(conn, plain, out, &mut at);
    out.truncate(at);
    r
}

/// Encrypts `plain` into `out` from `*at` on (bytes of `out` past `*at` are
/// scratch, overwritten), in records of at most 16 KiB (RFC 8446 §5.1);
/// `*at` ends past the last record. `out` may be left longer than `*at`.
fn seal_at<S: Side>(
    conn: &mut S,
    plain: &[u8],
    out: &mut Vec<u8>,
    at: &mut usize,
) -> Result<(), Failure> {
    for chunk in plain.chunks(MAX_PLAINTEXT) {
        let st = conn.process(&mut []);
        match st.state {
            Ok(ConnectionState::WriteTraffic(mut w)) => {
                encrypt_at(out, at, chunk.len(), |b| w.encrypt(chunk, b))?
            }
            Ok(other) => return Err(Failure::Alert(format!("cannot send in state {other:?}"))),
            Err(e) => return Err(Failure::Alert(e.to_string())),
        }
    }
    Ok(())
}

/// Writes `bytes` into `out` at `*at` (over scratch bytes, then past the
/// end), moving `*at` past them.
fn put_at(out: &mut Vec<u8>, at: &mut usize, bytes: &[u8]) {
    let over = out.len().saturating_sub(*at).min(bytes.len());
    out[*at..*at + over].copy_from_slice(&bytes[..over]);
    out.extend_from_slice(&bytes[over..]);
    *at += bytes.len();
}

/// Runs an encoder into the tail of `out`, growing it to what it needs.
fn encode_into(out: &mut Vec<u8>, mut f: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>) {
    let start = out.len();
    let mut room = 2048;
    loop {
        out.resize(start + room, 0);
        match f(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return;
            }
            Err(EncodeError::InsufficientSize(s)) => room = s.required_size,
            Err(EncodeError::AlreadyEncoded) => {
                out.truncate(start);
                return;
            }
        }
    }
}

fn encrypt_into(
    out: &mut Vec<u8>,
    len: usize,
    f: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<(), Failure> {
    let mut at = out.len();
    let r = encrypt_at(out, &mut at, len, f);
    out.truncate(at);
    r
}

/// Runs an encrypter of a `len`-byte payload into `out` at `*at`, growing
/// `out` (zero-filled) only where its scratch bytes do not give the room
/// the record needs; `*at` moves past the record (not on failure).
fn encrypt_at(
    out: &mut Vec<u8>,
    at: &mut usize,
    len: usize,
    mut f: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<(), Failure> {
    let start = *at;
    let mut room = len + RECORD_OVERHEAD + 64;
    loop {
        if out.len() < start + room {
            out.resize(start + room, 0);
        }
        match f(&mut out[start..start + room]) {
            Ok(n) => {
                *at = start + n;
                return Ok(());
            }
            Err(EncryptError::InsufficientSize(s)) if s.required_size > room => {
                room = s.required_size
            }
            Err(e) => return Err(Failure::Alert(e.to_string())),
        }
    }
}
