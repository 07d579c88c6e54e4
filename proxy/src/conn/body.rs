//! Both directions of one exchange: [`Upload`] streams the request body to the upstream while [`Download`] reads the response head (relaying interim 1xx answers) and streams the response to the client.
//!
//! The two run at the same time (see `forward::Conn::exchange`), so an
//! origin that answers before it has read the whole body — a 413 or 401
//! sent at once, or an echo that streams while it reads — is forwarded as
//! it answers. Bodies pass through fixed buffers; the kernel's socket
//! buffers give the backpressure: each side reads only after its previous
//! chunk was written on. A long Content-Length rest and the rest of a large
//! chunk's data go socket to socket instead (`bulk.rs`).

use zgix_parser::{
    BodyKind, ChunkedDecoder, Pieces, RequestHead, ResponseBody, ResponseHead, Status, Version,
};

use std::cell::Cell;

use super::bulk::{takes_bulk, Lane, Progress, RelayEnd};
use super::client::ClientConn;
use super::shard::Shard;
use super::state::ClientBytes;
use super::{upstream_io, Fail};
use crate::http::filters::Walk;
use crate::http::wire;
use crate::io::{Buf, Sock};
use crate::observe::decision::UpstreamError;
use crate::upstream::conn::UpConn;

/// Whether any byte of the current final (or 101) response reached the
/// client; relayed interim 1xx answers do not count. Set only by
/// [`send_final`], the one way [`Download`] writes an answer.
#[derive(Default)]
pub(super) struct Sent(Cell<bool>);

impl Sent {
    pub(super) fn get(&self) -> bool {
        self.0.get()
    }
}

/// Whether the request body is all read (the response head reads it: else
/// the client connection closes after the answer). Set only when
/// [`Upload::run`] ends.
pub(super) struct BodyRead(Cell<bool>);

impl BodyRead {
    /// `done`: there is no body to read.
    pub(super) fn new(done: bool) -> BodyRead {
        BodyRead(Cell::new(done))
    }

    pub(super) fn get(&self) -> bool {
        self.0.get()
    }
}

/// The request-body half of an exchange.
pub(super) struct Upload<'a> {
    pub client: &'a ClientConn,
    pub up: &'a UpConn,
    /// The client's bytes, the head already consumed: the body starts here,
    /// and a pipelined request may follow it.
    pub cl: &'a mut ClientBytes,
    pub chunked: &'a mut ChunkedDecoder,
    /// The chunked body re-encoded without extensions or trailers, as a
    /// gather list (`rechunk_up.rs`; made on the first chunked upload)...
    pub pieces: &'a mut Option<Pieces>,
    /// ... and copied, for a TLS upstream.
    pub rechunked: &'a mut Vec<u8>,
    pub body: BodyKind,
    /// Body bytes already sent with the head.
    pub done: u64,
    pub shard: &'a Shard,
    /// Set once the whole body went up (the response head reads it).
    pub finished: &'a BodyRead,
}

impl Upload<'_> {
    /// Streams the body from the client to the upstream, leaving the client
    /// bytes at the first byte after it (a pipelined request may follow).
    pub async fn run(self) -> Result<(), Fail> {
        let body_timeout = self.shard.rt.timeouts.client_body;
        self.client.set_read_timeout(Some(body_timeout));
        let cl = self.cl;
        let r = async {
            match self.body {
                BodyKind::None => many(self.client),
                BodyKind::Length(n) => {
                    let mut remaining = n - self.done;
                    cl.consume(self.done as usize);
                    // Both ends plaintext: a long rest moves socket to
                    // socket, decided on what is owed past the bytes here.
                    let rest = remaining - (cl.pending() as u64).min(remaining);
                    let bulk = super::bulk::plain(self.client)
                        .zip(super::bulk::plain_up(self.up))
                        .filter(|(c, _)| takes_bulk(n, rest, c));
                    // Before the first write: the client's receive stops here.
                    let mut lane = bulk.and_then(|(c, _)| super::bulk::lane(c, true));
                    if lane.is_none() {
                        many(self.client);
                    }
                    loop {
                        let take = (cl.pending() as u64).min(remaining) as usize;
                        if take > 0 {
                            self.up
                                .write_all(&cl.bytes()[..take])
                                .await
                                .map_err(|e| upstream_io(&e))?;
                            cl.consume(take);
                            remaining -= take as u64;
                        }
                        if remaining == 0 {
                            break;
                        }
                        if let Some((c, u)) = bulk {
                            relay_up(c, u, remaining, cl.scratch(), lane.take()).await?;
                            break;
                        }
                        cl.clear();
                        let n = read_client(self.client, cl.spare()).await?;
                        cl.filled(n);
                    }
                }
                BodyKind::Chunked => {
                    super::rechunk_up::ChunkedUp {
                        client: self.client,
                        up: self.up,
                        cl: &mut *cl,
                        dec: &mut *self.chunked,
                        pieces: self.pieces.get_or_insert_with(Pieces::new),
                        copy: &mut *self.rechunked,
                        shard: self.shard,
                    }
                    .run()
                    .await?
                }
            }
            Ok(())
        }
        .await;
        self.finished.0.set(r.is_ok());
        r
    }
}

/// The most read at a time for the framing after a chunk whose data took
/// the bulk path, until the next chunk's data begins: the CRLF and the next
/// size line (RFC 9112 §7.1) are usually a few bytes, and the next chunk's
/// data should stay in the socket for its own splices (a read of the whole
/// buffer copied up to 64 KiB of each chunk's data on epoll). Once in a
/// chunk too small for the bulk path, reads are full size again.
pub(super) const FRAMING_READ: usize = 4 << 10;

/// One read from the client; EOF and stalls end the exchange.
pub(super) async fn read_client(client: &ClientConn, buf: &mut [u8]) -> Result<usize, Fail> {
    match client.read(buf).await {
        Ok(0) | Err(_) => Err(Fail::ClientGone),
        Ok(n) => Ok(n),
    }
}

/// A plaintext client's body that is not spliced: its socket goes back to
/// (or stays on) the ring's multishot receive.
pub(super) fn many(client: &ClientConn) {
    if let Some(s) = super::bulk::plain(client) {
        s.receive_one(false);
    }
}

/// The rest of a Content-Length request body on the bulk path (`bulk.rs`).
pub(super) async fn relay_up(
    client: &Sock,
    up: &Sock,
    n: u64,
    buf: &mut [u8],
    lane: Option<Lane<'_>>,
) -> Result<(), Fail> {
    match super::bulk::relay(client, up, Some(n), buf, &Progress::NONE, lane).await {
        Ok(_) => Ok(()),
        Err(RelayEnd::Dst(e)) => Err(upstream_io(&e)),
        Err(_) => Err(Fail::ClientGone),
    }
}

/// The rest of a Content-Length response body on the bulk path (`bulk.rs`).
async fn relay_down(
    up: &Sock,
    client: &Sock,
    n: u64,
    buf: &mut [u8],
    lane: Option<Lane<'_>>,
) -> Result<(), Fail> {
    match super::bulk::relay(up, client, Some(n), buf, &Progress::NONE, lane).await {
        Ok(_) => Ok(()),
        Err(RelayEnd::Src(e)) => Err(upstream_io(&e)),
        Err(RelayEnd::SrcEof) => Err(Fail::Upstream(UpstreamError::Reset)),
        Err(RelayEnd::Dst(_)) => Err(Fail::ClientGone),
    }
}

/// What a completed response leaves behind.
pub(super) struct ResponseEnd {
    pub upstream_reusable: bool,
    pub client_keep: bool,
    /// The origin switched protocols (101): the connections become a tunnel.
    pub tunnel: bool,
}

/// The response half of an exchange.
pub(super) struct Download<'a> {
    pub shard: &'a Shard,
    pub li: usize,
    pub client: &'a ClientConn,
    pub up: &'a UpConn,
    pub ubuf: &'a mut Buf,
    pub ustart: &'a mut usize,
    pub uend: &'a mut usize,
    pub out: &'a mut Vec<u8>,
    pub resp: &'a mut ResponseHead,
    pub chunked: &'a mut ChunkedDecoder,
    pub req: &'a RequestHead,
    pub walk: &'a Walk,
    pub filtered: bool,
    /// The request asked to upgrade (a 101 is then a tunnel, not an error).
    pub upgrade: bool,
    /// Whether any byte of a final (or 101) response reached the client;
    /// relayed interim 1xx answers do not count.
    pub sent: &'a Sent,
    /// Whether the request body is all read (else the client connection
    /// closes after this answer, and the head says so).
    pub body_read: &'a BodyRead,
    /// zgix's Via name, or `None` when turned off.
    pub via: Option<&'a [u8]>,
    /// When the final (or 101) response head was parsed.
    pub head_seen: &'a std::cell::Cell<Option<std::time::Instant>>,
    /// The RateLimit fields to add to the final head (empty for none).
    pub rate_fields: &'a [u8],
    /// The cluster's header and idle timeouts.
    pub timeouts: crate::upstream::cluster::UpTimeouts,
    /// Statuses (`RetryOn::status_bit`) not passed on: the request goes to
    /// another endpoint instead.
    pub retry_status: u8,
}

impl Download<'_> {
    pub async fn run(mut self) -> Result<ResponseEnd, Fail> {
        self.read_response_head().await?;
        if self.retry_status & zgix_config::RetryOn::status_bit(self.resp.status) != 0 {
            return Err(Fail::Upstream(UpstreamError::Status5xx));
        }
        if self.resp.status == 101 {
            self.send_switch().await?;
            return Ok(ResponseEnd {
                upstream_reusable: false,
                client_keep: false,
                tunnel: true,
            });
        }
        self.send_response().await
    }

    /// Reads the response head into `ubuf`, passing interim (1xx) responses
    /// to HTTP/1.1 clients on the way with hop-by-hop fields stripped (RFC
    /// 9110 §15.2: a proxy forwards 1xx it did not ask for). A `100` answers
    /// the client's own `Expect: 100-continue`, which went to the origin.
    async fn read_response_head(&mut self) -> Result<(), Fail> {
        let shard = self.shard;
        self.up.set_read_timeout(Some(self.timeouts.header));
        *self.ustart = 0;
        *self.uend = 0;
        let mut got_any = false;
        loop {
            if *self.uend > *self.ustart {
                let base = &self.ubuf[*self.ustart..*self.uend];
                match shard.resp_parser.parse(base, self.req.method, self.resp) {
                    Ok(Status::Complete(())) => {
                        let s = self.resp.status;
                        if !(100..200).contains(&s) {
                            self.head_seen.set(Some(shard.driver.now()));
                            return Ok(());
                        }
                        if s == 101 {
                            if self.upgrade {
                                self.head_seen.set(Some(shard.driver.now()));
                                return Ok(());
                            }
                            return Err(Fail::Upstream(UpstreamError::BadResponse));
                        }
                        let hl = self.resp.head_len;
                        if self.req.version == Version::Http11 {
                            wire::write_interim_head(self.out, base, self.resp, self.via);
                            // Not `sent`: an interim answer is no answer, and
                            // if the origin fails now the client still gets
                            // its final 502 or 504 after it.
                            self.client
                                .write_all(self.out)
                                .await
                                .map_err(|_| Fail::ClientGone)?;
                        }
                        *self.ustart += hl;
                        continue;
                    }
                    Ok(Status::Partial) => {}
                    Err(_) => return Err(Fail::Upstream(UpstreamError::BadResponse)),
                }
            }
            if *self.ustart > 0 {
                self.ubuf.copy_within(*self.ustart..*self.uend, 0);
                *self.uend -= *self.ustart;
                *self.ustart = 0;
            }
            if *self.uend == self.ubuf.len() {
                return Err(Fail::Upstream(UpstreamError::BadResponse));
            }
            let at = *self.uend;
            // Before any response byte a failure is `UpstreamEarly`: the
            // request may go to another endpoint (or, on a pooled
            // connection, to a fresh one) if it can be sent again.
            let early = |k| {
                if got_any {
                    Fail::Upstream(k)
                } else {
                    Fail::UpstreamEarly(k)
                }
            };
            match self.up.read(&mut self.ubuf[at..]).await {
                Ok(0) if got_any => return Err(Fail::Upstream(UpstreamError::BadResponse)),
                Ok(0) => return Err(early(UpstreamError::Reset)),
                Ok(n) => {
                    *self.uend += n;
                    got_any = true;
                }
                // A timeout is not "early": the origin has the request and may
                // still act on it, so it is never sent again (docs/config.md,
                // retries: connect failures, and resets before any byte).
                Err(e) if super::is_timeout(&e) => {
                    return Err(Fail::Upstream(UpstreamError::HeaderTimeout))
                }
                Err(_) => return Err(early(UpstreamError::Reset)),
            }
        }
    }

    /// Sends the `101` on with the upgrade fields the origin chose.
    async fn send_switch(&mut self) -> Result<(), Fail> {
        let base = &self.ubuf[*self.ustart..*self.uend];
        let upgrade = self
            .resp
            .headers
            .iter()
            .find(|h| h.name.get(base).eq_ignore_ascii_case(b"upgrade"))
            .map(|h| h.value.get(base));
        let Some(upgrade) = upgrade else {
            return Err(Fail::Upstream(UpstreamError::BadResponse));
        };
        wire::write_interim_head(self.out, base, self.resp, self.via);
        super::append_fields(
            self.out,
            &[b"Connection: upgrade\r\nUpgrade: ", upgrade, b"\r\n"],
        );
        *self.ustart += self.resp.head_len;
        self.shard.counters.response(self.li, 101);
        send_final(self.client, self.sent, self.out, false).await
    }

    /// Writes the response head and streams the body to the client.
    async fn send_response(&mut self) -> Result<ResponseEnd, Fail> {
        let shard = self.shard;
        let filters = &shard.rt.listeners[self.li].filters;
        self.up.set_read_timeout(Some(self.timeouts.idle));
        let http10 = self.req.version == Version::Http10;
        // An HTTP/1.0 client cannot read chunked framing: de-chunk and delimit by close.
        let dechunk = http10 && self.resp.body == ResponseBody::Chunked;
        let client_keep = self.req.keep_alive
            && self.body_read.get()
            && !shard.closing.get()
            && self.resp.body != ResponseBody::CloseDelimited
            && !dechunk;
        if !client_keep {
            self.client.closing();
        }
        let edits = (self.filtered && self.walk.edits_response).then_some((filters, self.walk));
        if let Some(io) = self.client.stream() {
            // An HTTP/2 stream takes the parsed head: no HTTP/1.1 text of it.
            let added = super::h2::Added {
                edits,
                via: self.via,
                rate_fields: self.rate_fields,
            };
            let base = &mut self.ubuf[*self.ustart..*self.uend];
            super::h2::answer_parsed(io, base, self.resp, added, self.out)
                .map_err(|_| Fail::ClientGone)?;
            self.out.clear();
            self.sent.0.set(true);
        } else {
            let base = &self.ubuf[*self.ustart..*self.uend];
            let framing = wire::ClientFraming {
                keep: client_keep,
                http10,
                dechunk,
            };
            wire::write_response_head_via(self.out, base, self.resp, framing, edits, self.via);
            crate::http::ratelimit::insert(self.out, self.rate_fields);
        }
        let mut pos = *self.ustart + self.resp.head_len;
        let reusable;
        match self.resp.body {
            ResponseBody::None => {
                self.up.sock().receive_one(false);
                reusable = pos == *self.uend;
                self.write_out_as(!client_keep).await?;
            }
            ResponseBody::Length(n) => {
                let avail = (*self.uend - pos) as u64;
                let first = avail.min(n) as usize;
                let mut remaining = n - first as u64;
                let bulk = super::bulk::plain(self.client)
                    .zip(super::bulk::plain_up(self.up))
                    .filter(|(c, _)| takes_bulk(n, remaining, c));
                // Before the head is written: the upstream's receive stops
                // here, and the rest of the body stays in its socket.
                let lane = bulk.and_then(|(_, u)| super::bulk::lane(u, true));
                if lane.is_none() {
                    self.up.sock().receive_one(false);
                }
                // The whole answer in this write, on a connection that
                // closes after it: TLS sends close_notify with it.
                let last = !client_keep && remaining == 0;
                if self.out.len() + first <= self.out.capacity() {
                    self.out.extend_from_slice(&self.ubuf[pos..pos + first]);
                    self.write_out_as(last).await?;
                } else {
                    self.write_out().await?;
                    self.write_client_u_as(pos, pos + first, last).await?;
                }
                pos += first;
                if let Some((c, u)) = bulk {
                    relay_down(u, c, remaining, &mut self.ubuf[..], lane).await?;
                    (remaining, pos, *self.uend) = (0, 0, 0);
                }
                while remaining > 0 {
                    let got = self.read_upstream().await?;
                    let take = (got as u64).min(remaining) as usize;
                    remaining -= take as u64;
                    self.write_client_u_as(0, take, !client_keep && remaining == 0)
                        .await?;
                    pos = take;
                    *self.uend = got;
                }
                reusable = pos == *self.uend;
            }
            ResponseBody::Chunked => {
                // Relayed raw, both ends plaintext: the data of a large chunk
                // may take the bulk path (`bulk.rs`). The upstream's receive
                // mode is then left as the last body set it: a spliced chunk
                // keeps (or sets) the one-buffer receive, and a body that
                // ends with none spliced goes back to the multishot one.
                let bulk = super::bulk::plain(self.client)
                    .zip(super::bulk::plain_up(self.up))
                    .filter(|_| !dechunk);
                if bulk.is_none() {
                    self.up.sock().receive_one(false);
                }
                // After a spliced chunk, until the next chunk's data: reads
                // of at most FRAMING_READ.
                let (mut spliced, mut framing) = (false, false);
                *self.chunked = ChunkedDecoder::new(u64::MAX);
                let mut head_pending = true;
                loop {
                    let done = self
                        .relay_chunks(&mut pos, dechunk, &mut head_pending)
                        .await?;
                    if done {
                        break;
                    }
                    // Everything buffered is scanned and written on (the head
                    // too), and the chunk still owes its rest: that moves
                    // socket to socket, then the decoder skips it and scans
                    // the CRLF after it from the next read (RFC 9112 §7.1).
                    let owed = self.chunked.data_owed();
                    if let Some((c, u)) =
                        bulk.filter(|_| pos == *self.uend && super::bulk::takes_bulk_chunk(owed))
                    {
                        let lane = super::bulk::lane(u, true);
                        relay_down(u, c, owed, &mut self.ubuf[..], lane).await?;
                        self.chunked.skip_data(owed);
                        (pos, *self.uend) = (0, 0);
                        (spliced, framing) = (true, true);
                    } else if owed > 0 {
                        // A small chunk: read on at full size.
                        framing = false;
                    }
                    let rest = *self.uend - pos;
                    self.ubuf.copy_within(pos..*self.uend, 0);
                    *self.uend = rest;
                    pos = 0;
                    if *self.uend == self.ubuf.len() {
                        return Err(Fail::Upstream(UpstreamError::BadResponse));
                    }
                    let at = *self.uend;
                    let end = match framing {
                        true => (at + FRAMING_READ).min(self.ubuf.len()),
                        false => self.ubuf.len(),
                    };
                    match self.up.read(&mut self.ubuf[at..end]).await {
                        Ok(0) => return Err(Fail::Upstream(UpstreamError::Reset)),
                        Ok(n) => *self.uend += n,
                        Err(e) => return Err(upstream_io(&e)),
                    }
                }
                if bulk.is_some() && !spliced {
                    self.up.sock().receive_one(false);
                }
                reusable = pos == *self.uend;
            }
            ResponseBody::CloseDelimited => {
                self.up.sock().receive_one(false);
                self.out.extend_from_slice(&self.ubuf[pos..*self.uend]);
                self.write_out().await?;
                loop {
                    match self.up.read(&mut self.ubuf[..]).await {
                        Ok(0) => break,
                        Ok(n) => self.write_client_u(0, n).await?,
                        Err(e) => return Err(upstream_io(&e)),
                    }
                }
                reusable = false;
            }
        }
        Ok(ResponseEnd {
            upstream_reusable: reusable,
            client_keep,
            tunnel: false,
        })
    }

    /// Feeds `ubuf[pos..uend]` through the chunked scanner and writes it on:
    /// raw to HTTP/1.1 clients, data only when de-chunking. The response head
    /// still in `out` goes out with the first bytes in one write.
    async fn relay_chunks(
        &mut self,
        pos: &mut usize,
        dechunk: bool,
        head_pending: &mut bool,
    ) -> Result<bool, Fail> {
        let from = *pos;
        let mut done = false;
        while *pos < *self.uend {
            let p = self
                .chunked
                .feed(&self.ubuf[*pos..*self.uend])
                .map_err(|_| Fail::Upstream(UpstreamError::BadResponse))?;
            if dechunk && !p.data.is_empty() {
                let (a, b) = (*pos + p.data.start, *pos + p.data.end);
                self.stage(a, b, head_pending).await?;
            }
            *pos += p.consumed;
            if p.done {
                done = true;
                break;
            }
            if p.consumed == 0 {
                break;
            }
        }
        if !dechunk && *pos > from {
            self.stage(from, *pos, head_pending).await?;
        }
        if *head_pending {
            self.write_out().await?;
            *head_pending = false;
        }
        Ok(done)
    }

    /// Writes `ubuf[a..b]` to the client, joined to the pending head when it fits.
    async fn stage(&mut self, a: usize, b: usize, head_pending: &mut bool) -> Result<(), Fail> {
        if *head_pending {
            if self.out.len() + (b - a) <= self.out.capacity() {
                self.out.extend_from_slice(&self.ubuf[a..b]);
                return Ok(());
            }
            self.write_out().await?;
            *head_pending = false;
        }
        self.write_client_u(a, b).await
    }

    async fn read_upstream(&mut self) -> Result<usize, Fail> {
        match self.up.read(&mut self.ubuf[..]).await {
            Ok(0) => Err(Fail::Upstream(UpstreamError::Reset)),
            Ok(n) => Ok(n),
            Err(e) => Err(upstream_io(&e)),
        }
    }

    async fn write_out(&mut self) -> Result<(), Fail> {
        self.write_out_as(false).await
    }

    /// `last`: nothing follows on the connection ([`send_final`]).
    async fn write_out_as(&mut self, last: bool) -> Result<(), Fail> {
        send_final(self.client, self.sent, self.out, last).await
    }

    async fn write_client_u(&mut self, a: usize, b: usize) -> Result<(), Fail> {
        self.write_client_u_as(a, b, false).await
    }

    async fn write_client_u_as(&mut self, a: usize, b: usize, last: bool) -> Result<(), Fail> {
        if a == b {
            return Ok(());
        }
        send_final(self.client, self.sent, &self.ubuf[a..b], last).await
    }
}

/// Writes bytes of the final (or 101) answer to the client: the one writer
/// of [`Sent`]. `last`: the connection closes after them (TLS sends
/// `close_notify` in the same send).
async fn send_final(
    client: &ClientConn,
    sent: &Sent,
    bytes: &[u8],
    last: bool,
) -> Result<(), Fail> {
    sent.0.set(true);
    let r = match last {
        true => client.write_all_last(bytes).await,
        false => client.write_all(bytes).await,
    };
    r.map_err(|_| Fail::ClientGone)
}
