//! Header blocks (RFC 9113 §4.3, §6.2, §6.10): HEADERS with its padding and priority removed, CONTINUATION frames joined in a buffer held only while the block is open and bounded by max_header_list (CVE-2024-27316), the block decoded by HPACK (always to its end, so the dynamic table stays in step), and what it opens: a new stream, trailers, or a refusal.

use super::request::{Collect, Collected};
use super::streams::{Closed, Past, Stream, RECV_CLOSED, SEND_CLOSED};
use super::{ConnError, Event, Reason, Server, Shutdown};
use crate::frame::{self, be32, ErrorCode, Head, StreamId, END_HEADERS, END_STREAM, PADDED};
use crate::frame::{DEFAULT_WINDOW, PRIORITY_FLAG};
use crate::hpack::DecodeError;

type Res = Result<(), ConnError>;

/// A header block waiting for its CONTINUATION frames.
pub(super) struct Open {
    id: StreamId,
    end_stream: bool,
    /// The HEADERS made the stream depend on itself (§5.3.1).
    self_dep: bool,
    buf: Vec<u8>,
    frames: u32,
}

impl Open {
    pub fn heap_bytes(&self) -> usize {
        self.buf.capacity()
    }
}

impl Server {
    /// HEADERS (§6.2).
    pub(super) fn headers(&mut self, h: Head, p: &[u8], on: &mut impl FnMut(Event<'_>)) -> Res {
        if h.id == 0 || h.id.is_multiple_of(2) {
            // §5.1.1: clients open odd streams.
            return self.protocol();
        }
        let mut frag = p;
        let mut pad = 0;
        if h.flags & PADDED != 0 {
            let Some((&n, rest)) = frag.split_first() else {
                return self.protocol();
            };
            pad = usize::from(n);
            frag = rest;
        }
        let mut self_dep = false;
        if h.flags & PRIORITY_FLAG != 0 {
            if frag.len() < 5 {
                return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
            }
            self_dep = be32(frag, 0) & 0x7fff_ffff == h.id;
            frag = &frag[5..];
        }
        if pad > frag.len() {
            // §6.2: padding past the fragment.
            return self.protocol();
        }
        let frag = &frag[..frag.len() - pad];
        let end_stream = h.flags & END_STREAM != 0;
        if h.flags & END_HEADERS != 0 {
            return self.end_block(h.id, end_stream, self_dep, frag, on);
        }
        if frag.len() > self.cfg.max_header_list as usize {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::HeaderFlood));
        }
        self.block = Some(Open {
            id: h.id,
            end_stream,
            self_dep,
            buf: frag.to_vec(),
            frames: 0,
        });
        Ok(())
    }

    /// CONTINUATION (§6.10): only on the open block's stream.
    pub(super) fn continuation(
        &mut self,
        h: Head,
        p: &[u8],
        on: &mut impl FnMut(Event<'_>),
    ) -> Res {
        let max = self.cfg.max_header_list as usize;
        let max_frames = self.cfg.max_continuations;
        let end = h.flags & END_HEADERS != 0;
        let Some(b) = &mut self.block else {
            return self.protocol();
        };
        if h.id != b.id {
            return self.protocol();
        }
        b.frames += 1;
        if b.buf.len() + p.len() > max || b.frames > max_frames {
            // A block that large cannot decode under the list limit; it is
            // not buffered to find out (CVE-2024-27316).
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::HeaderFlood));
        }
        b.buf.extend_from_slice(p);
        if p.is_empty() && !end {
            self.empty_frame()?;
        }
        if !end {
            return Ok(());
        }
        let Some(b) = self.block.take() else {
            return Ok(());
        };
        self.end_block(b.id, b.end_stream, b.self_dep, &b.buf, on)
    }

    /// Decodes a block for a stream that gets nothing from it.
    fn discard(&mut self, block: &[u8]) -> Res {
        match self
            .decoder
            .decode(block, self.cfg.max_header_list as usize, |_, _| Err(()))
        {
            Err(DecodeError::Compression) => self.hpack_error(),
            _ => Ok(()),
        }
    }

    fn hpack_error(&mut self) -> Res {
        Err(self.fail(ErrorCode::COMPRESSION_ERROR, Reason::Hpack))
    }

    /// A whole header block on stream `id`.
    fn end_block(
        &mut self,
        id: StreamId,
        es: bool,
        self_dep: bool,
        block: &[u8],
        on: &mut impl FnMut(Event<'_>),
    ) -> Res {
        if let Some(s) = self.streams.get_ref(id) {
            if s.flags & RECV_CLOSED != 0 {
                // §5.1: half-closed (remote).
                self.discard(block)?;
                return self.stream_error(id, ErrorCode::STREAM_CLOSED, on);
            }
            return self.trailers(id, es, self_dep, block, on);
        }
        match self.streams.state(id) {
            Past::Idle => self.streams.open_id(id),
            Past::Closed(Closed::ByClient) => {
                self.discard(block)?;
                return self.stream_error(id, ErrorCode::STREAM_CLOSED, on);
            }
            // §5.1: a closed stream; the connection's error.
            Past::Closed(Closed::Done) => {
                return Err(self.fail(ErrorCode::STREAM_CLOSED, Reason::Protocol))
            }
            // §5.1.1: a stream id lower than one used, never used itself.
            Past::Skipped => return self.protocol(),
            // §5.1: frames after our RST_STREAM are ignored (and on a stream
            // too old to tell: trailers in flight, most likely).
            Past::Closed(Closed::ByServer) | Past::Forgotten => return self.discard(block),
        }
        if self.shutdown == Shutdown::Final {
            // §6.8: streams above the GOAWAY's last are ignored.
            self.streams.remember(id, Closed::ByServer);
            return self.discard(block);
        }
        if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
            // §5.1.2.
            self.discard(block)?;
            return self.stream_error(id, ErrorCode::REFUSED_STREAM, on);
        }
        self.request(id, es, self_dep, block, on)
    }

    /// Decodes one header block into the scratch buffer (request fields,
    /// or trailers): the decoder's result, whether a field was malformed,
    /// and where the fields are.
    fn collect(
        &mut self,
        block: &[u8],
        trailers: bool,
    ) -> (Result<bool, DecodeError>, bool, Collected) {
        let max = self.cfg.max_header_list as usize;
        let mut c = Collect::new(&mut self.scratch, trailers);
        let r = self.decoder.decode(block, max, |n, v| c.field(n, v));
        let malformed = c.malformed;
        (r, malformed, c.finish())
    }

    /// A new stream's request.
    fn request(
        &mut self,
        id: StreamId,
        es: bool,
        self_dep: bool,
        block: &[u8],
        on: &mut impl FnMut(Event<'_>),
    ) -> Res {
        let (r, malformed, done) = self.collect(block, false);
        match r {
            Err(DecodeError::Compression) => return self.hpack_error(),
            Err(DecodeError::ListTooLarge) => return self.too_large(id, es),
            Ok(_) => {}
        }
        let cl = done.content_length;
        // §8.1.1: END_STREAM with a content-length over 0 is malformed.
        let bad_length = es && cl.is_some_and(|n| n > 0);
        if malformed || self_dep || bad_length {
            return self.stream_error(id, ErrorCode::PROTOCOL_ERROR, on);
        }
        let Some(head) = done.head(&self.scratch) else {
            return self.stream_error(id, ErrorCode::PROTOCOL_ERROR, on);
        };
        let recv = if self.acked {
            self.cfg.initial_window
        } else {
            self.cfg.initial_window.max(DEFAULT_WINDOW)
        };
        self.streams.insert(Stream {
            id,
            flags: if es { RECV_CLOSED } else { 0 },
            recv: recv as i32,
            held: 0,
            owed: 0,
            send: i64::from(self.peer_initial_window),
            body_left: cl.unwrap_or(u64::MAX),
        });
        self.streams.last_taken = id;
        on(Event::Request {
            id,
            head: &head,
            end_stream: es,
        });
        if self.scratch.capacity() > 16 * 1024 {
            self.scratch = Vec::new();
        }
        Ok(())
    }

    /// A header list over max_header_list: 431 (RFC 6585 §5, RFC 9113
    /// §10.5.1), the decoder kept in step; the connection goes on.
    fn too_large(&mut self, id: StreamId, es: bool) -> Res {
        self.stats.headers_too_large += 1;
        let at = self.out.len();
        frame::put_head(
            &mut self.out,
            0,
            frame::HEADERS,
            END_HEADERS | END_STREAM,
            id,
        );
        self.encoder.begin(&mut self.out);
        self.encoder.status(431, &mut self.out);
        let len = self.out.len() - at - 9;
        frame::set_len(&mut self.out, at, len);
        if es {
            self.streams.remember(id, Closed::Done);
        } else {
            // The client may still be sending: no more of it (§8.1).
            frame::put_rst(&mut self.out, id, ErrorCode::NO_ERROR);
            self.streams.remember(id, Closed::ByServer);
        }
        self.tick.stream_errors += 1;
        if self.tick.stream_errors > self.cfg.max_stream_errors_per_tick {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::StreamErrors));
        }
        self.control_queued(self.out.len() - at)
    }

    /// A header block on an open stream: trailers (§8.1), which end it.
    fn trailers(
        &mut self,
        id: StreamId,
        es: bool,
        self_dep: bool,
        block: &[u8],
        on: &mut impl FnMut(Event<'_>),
    ) -> Res {
        let (r, malformed, done) = self.collect(block, true);
        match r {
            Err(DecodeError::Compression) => return self.hpack_error(),
            Err(DecodeError::ListTooLarge) => {
                return self.stream_error(id, ErrorCode::ENHANCE_YOUR_CALM, on)
            }
            Ok(_) => {}
        }
        let body_left = self.streams.get_ref(id).map_or(u64::MAX, |s| s.body_left);
        // §8.1: trailers end the stream; §8.1.1: the body is all there.
        if !es || malformed || self_dep || (body_left != u64::MAX && body_left != 0) {
            return self.stream_error(id, ErrorCode::PROTOCOL_ERROR, on);
        }
        if let Some(s) = self.streams.get(id) {
            s.flags |= RECV_CLOSED;
            if s.flags & SEND_CLOSED != 0 {
                if let Some(s) = self.streams.close(id, Closed::Done) {
                    self.conn_owed += s.held;
                }
            }
        }
        on(Event::Trailers {
            id,
            fields: done.fields(&self.scratch),
        });
        Ok(())
    }
}
