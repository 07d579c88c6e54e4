//! What the caller sends (RFC 9113 §6.1, §6.2, §6.9, §8.1): responses and trailers through the HPACK encoder, split into CONTINUATION frames past the client's SETTINGS_MAX_FRAME_SIZE; DATA within the send windows; releases of received DATA turned into WINDOW_UPDATE once half a window is owed; resets.

use super::streams::{Closed, ANSWERED, RECV_CLOSED, SEND_CLOSED};
use super::{Server, StreamGone};
use crate::frame::{self, ErrorCode, StreamId, CONTINUATION, END_HEADERS, END_STREAM, HEADERS};

/// What the frame buffer starts with when a response comes while it holds
/// nothing (it is freed whenever the connection has no stream open): about
/// a hundred small answers, so a burst does not grow it a dozen times.
const OUT_START: usize = 16 * 1024;

impl Server {
    /// Room for `n` more bytes of frames.
    fn out_room(&mut self, n: usize) {
        let n = if self.out.capacity() == 0 {
            n.max(OUT_START)
        } else {
            n
        };
        self.out.reserve(n);
    }

    /// The response's head (`status` under 200: an interim one, which may
    /// come more than once before the final). Field names must be
    /// lowercase and not connection-specific (§8.2.2): the caller's to see to.
    /// Returns the bytes of the HEADERS (and CONTINUATION) frames queued.
    pub fn send_response<'f>(
        &mut self,
        id: StreamId,
        status: u16,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
        end_stream: bool,
    ) -> Result<usize, StreamGone> {
        let interim = status < 200;
        match self.streams.get_ref(id) {
            Some(s) if self.dead.is_none() && s.flags & (ANSWERED | SEND_CLOSED) == 0 => {}
            _ => return Err(StreamGone),
        }
        self.out_room(64);
        let at = self.out.len();
        frame::put_head(&mut self.out, 0, HEADERS, 0, id);
        self.encoder.begin(&mut self.out);
        self.encoder.status(status, &mut self.out);
        for (n, v) in fields {
            self.encoder.field(n, v, false, &mut self.out);
        }
        let es = end_stream && !interim;
        self.close_block(at, id, es);
        if !interim {
            self.sent_flags(id, if es { ANSWERED | SEND_CLOSED } else { ANSWERED });
        }
        Ok(self.out.len() - at)
    }

    /// Trailers after the response (§8.1): they end the stream.
    pub fn send_trailers<'f>(
        &mut self,
        id: StreamId,
        fields: impl Iterator<Item = (&'f [u8], &'f [u8])>,
    ) -> Result<(), StreamGone> {
        match self.streams.get_ref(id) {
            Some(s) if self.dead.is_none() && s.flags & (ANSWERED | SEND_CLOSED) == ANSWERED => {}
            _ => return Err(StreamGone),
        }
        let at = self.out.len();
        frame::put_head(&mut self.out, 0, HEADERS, 0, id);
        self.encoder.begin(&mut self.out);
        for (n, v) in fields {
            self.encoder.field(n, v, false, &mut self.out);
        }
        self.close_block(at, id, true);
        self.sent_flags(id, SEND_CLOSED);
        Ok(())
    }

    /// Sets the HEADERS frame's length and flags at `out[at..]`, splitting
    /// its block into CONTINUATION frames past the client's frame size (§6.10).
    fn close_block(&mut self, at: usize, id: StreamId, es: bool) {
        let max = self.peer_max_frame as usize;
        let len = self.out.len() - at - 9;
        let es = if es { END_STREAM } else { 0 };
        if len <= max {
            frame::set_len(&mut self.out, at, len);
            self.out[at + 4] = END_HEADERS | es;
            return;
        }
        // Rare (a head over 16 KiB): the block moved out and cut.
        let block = self.out.split_off(at + 9);
        frame::set_len(&mut self.out, at, max);
        self.out[at + 4] = es;
        self.out.extend_from_slice(&block[..max]);
        let mut rest = &block[max..];
        while !rest.is_empty() {
            let n = rest.len().min(max);
            let flags = if n == rest.len() { END_HEADERS } else { 0 };
            frame::put_head(&mut self.out, n, CONTINUATION, flags, id);
            self.out.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
    }

    /// Marks what the server sent on a stream; closes it when both sides ended.
    fn sent_flags(&mut self, id: StreamId, flags: u8) {
        let Some(s) = self.streams.get(id) else {
            return;
        };
        s.flags |= flags;
        if s.flags & (RECV_CLOSED | SEND_CLOSED) == RECV_CLOSED | SEND_CLOSED {
            if let Some(s) = self.streams.close(id, Closed::Done) {
                self.conn_owed += s.held;
                self.credit_connection();
            }
        }
    }

    /// What DATA may be sent on the stream now: the smaller of its window
    /// and the connection's (0 when it is gone).
    pub fn send_window(&self, id: StreamId) -> usize {
        match self.streams.get_ref(id) {
            Some(s) if s.flags & SEND_CLOSED == 0 => s.send.min(self.conn_send).max(0) as usize,
            _ => 0,
        }
    }

    /// DATA (§6.1) within the stream's and the connection's send windows,
    /// in frames of the client's SETTINGS_MAX_FRAME_SIZE at most; returns
    /// the bytes taken (0: wait for [`super::Event::WindowOpen`]). END_STREAM
    /// goes with the last byte, when all of `data` was taken.
    pub fn send_data(
        &mut self,
        id: StreamId,
        data: &[u8],
        end_stream: bool,
    ) -> Result<usize, StreamGone> {
        let Some(s) = self.streams.get_ref(id) else {
            return Err(StreamGone);
        };
        if self.dead.is_some() || s.flags & (ANSWERED | SEND_CLOSED) != ANSWERED {
            return Err(StreamGone);
        }
        let n = data.len().min(s.send.min(self.conn_send).max(0) as usize);
        let es = end_stream && n == data.len();
        if n == 0 && !es {
            return Ok(0);
        }
        let max = self.peer_max_frame as usize;
        self.out_room(n + n.div_ceil(max).max(1) * 9);
        let mut rest = &data[..n];
        loop {
            let k = rest.len().min(max);
            let last = k == rest.len();
            let flags = if last && es { END_STREAM } else { 0 };
            frame::put_head(&mut self.out, k, frame::DATA, flags, id);
            self.out.extend_from_slice(&rest[..k]);
            rest = &rest[k..];
            if last {
                break;
            }
        }
        self.conn_send -= n as i64;
        if let Some(s) = self.streams.get(id) {
            s.send -= n as i64;
        }
        if es {
            self.sent_flags(id, SEND_CLOSED);
        }
        Ok(n)
    }

    /// The caller consumed `n` bytes of the stream's DATA: the stream and
    /// the connection get them back with WINDOW_UPDATE once half of their
    /// window is owed (§6.9). What a stream held when it closed was given
    /// back then: a late release is ignored.
    pub fn release(&mut self, id: StreamId, n: usize) {
        let half = (self.cfg.initial_window / 2).max(1);
        if let Some(s) = self.streams.get(id) {
            let n = (n as u32).min(s.held);
            s.held -= n;
            s.owed += n;
            self.conn_owed += n;
            if s.flags & RECV_CLOSED == 0 && s.owed >= half && self.dead.is_none() {
                let inc = s.owed;
                s.recv += inc as i32;
                s.owed = 0;
                frame::put_window_update(&mut self.out, id, inc);
            }
        }
        self.credit_connection();
    }

    /// A WINDOW_UPDATE for the connection once half its window is owed.
    pub(super) fn credit_connection(&mut self) {
        if self.conn_owed >= (self.cfg.connection_window / 2).max(1) && self.dead.is_none() {
            self.conn_recv += i64::from(self.conn_owed);
            frame::put_window_update(&mut self.out, 0, self.conn_owed);
            self.conn_owed = 0;
        }
    }

    /// Resets a stream (RST_STREAM, §6.4); no event follows for it. A
    /// stream not open is left as it closed (its frames keep their answer).
    pub fn reset(&mut self, id: StreamId, code: ErrorCode) {
        if self.dead.is_some() || self.streams.get_ref(id).is_none() {
            return;
        }
        if let Some(s) = self.streams.close(id, Closed::ByServer) {
            self.conn_owed += s.held;
            frame::put_rst(&mut self.out, id, code);
            self.credit_connection();
        }
    }
}
