//! Reading the client's bytes (RFC 9113 §3.4, §4, §6): the preface, frame headers checked against SETTINGS_MAX_FRAME_SIZE, DATA handed over in pieces against the receive windows (§6.1, §6.9), and the control frames (PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, §6.3–§6.9); HEADERS and CONTINUATION go to `block`.

use super::streams::{Closed, Past, RECV_CLOSED, SEND_CLOSED};
use super::{ConnError, Event, Reason, Server, Shutdown, SHUTDOWN_PING};
use crate::frame::{self, be32, ErrorCode, Head, StreamId, ACK, END_STREAM, MAX_WINDOW, PADDED};

/// A DATA frame whose payload is still coming.
pub(super) struct DataLeft {
    id: StreamId,
    /// Data bytes still to hand over (or drop).
    left: usize,
    /// Padding after them.
    pad: usize,
    end_stream: bool,
    /// Handed to the caller; else dropped (a stream reset or closed).
    deliver: bool,
}

type Res = Result<(), ConnError>;

impl Server {
    /// Bytes read from the client; returns how many were used. Whole frames
    /// are used, but for DATA, whose payload is handed over as it comes: the
    /// caller keeps the unused tail and calls again with more bytes after it.
    /// `Err`: the connection is over (a GOAWAY is queued in `pending`).
    pub fn recv(
        &mut self,
        input: &[u8],
        on: &mut impl FnMut(Event<'_>),
    ) -> Result<usize, ConnError> {
        if let Some(e) = self.dead {
            return Err(e);
        }
        let mut at = 0;
        if self.preface_left > 0 {
            let from = frame::PREFACE.len() - usize::from(self.preface_left);
            let n = input.len().min(usize::from(self.preface_left));
            if input[..n] != frame::PREFACE[from..from + n] {
                // §3.4: not HTTP/2; GOAWAY with last stream 0.
                return Err(self.fail(ErrorCode::PROTOCOL_ERROR, Reason::BadPreface));
            }
            self.preface_left -= n as u8;
            at = n;
        }
        loop {
            if let Some(d) = &mut self.data {
                let rest = &input[at..];
                let n = d.left.min(rest.len());
                d.left -= n;
                let done = d.left == 0;
                if d.deliver && (n > 0 || (done && d.end_stream)) {
                    on(Event::Data {
                        id: d.id,
                        data: &rest[..n],
                        end_stream: done && d.end_stream,
                    });
                }
                at += n;
                if !done {
                    break;
                }
                let p = d.pad.min(input.len() - at);
                d.pad -= p;
                at += p;
                if d.pad > 0 {
                    break;
                }
                self.data = None;
                continue;
            }
            let Some(h) = Head::parse(&input[at..]) else {
                break;
            };
            if h.len > self.cfg.max_frame_size as usize {
                // §4.2: a frame larger than we allow.
                return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
            }
            if !self.peer_settings {
                if h.kind != frame::SETTINGS || h.flags & ACK != 0 {
                    // §3.4: the client's preface is the magic, then SETTINGS.
                    return Err(self.fail(ErrorCode::PROTOCOL_ERROR, Reason::BadPreface));
                }
                self.peer_settings = true;
            }
            if self.block.is_some() && h.kind != frame::CONTINUATION {
                // §6.2, §6.10: only CONTINUATION while a header block is open.
                return Err(self.fail(ErrorCode::PROTOCOL_ERROR, Reason::Protocol));
            }
            if h.kind == frame::DATA {
                let head = if h.flags & PADDED != 0 && h.len > 0 {
                    10
                } else {
                    9
                };
                if input.len() - at < head {
                    break;
                }
                let pad = (head == 10).then(|| input[at + 9]);
                at += head;
                self.data_head(h, pad, on)?;
                continue;
            }
            if input.len() - at < 9 + h.len {
                break;
            }
            let p = &input[at + 9..at + 9 + h.len];
            at += 9 + h.len;
            self.frame(h, p, on)?;
        }
        Ok(at)
    }

    /// A frame other than DATA, whole.
    fn frame(&mut self, h: Head, p: &[u8], on: &mut impl FnMut(Event<'_>)) -> Res {
        match h.kind {
            frame::HEADERS => self.headers(h, p, on),
            frame::CONTINUATION => self.continuation(h, p, on),
            frame::PRIORITY => self.priority(h, p, on),
            frame::RST_STREAM => self.rst_stream(h, p, on),
            frame::SETTINGS => self.settings(h, p, on),
            frame::PING => self.ping(h, p),
            frame::GOAWAY => {
                if h.id != 0 {
                    return Err(self.fail(ErrorCode::PROTOCOL_ERROR, Reason::Protocol));
                }
                if p.len() < 8 {
                    return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
                }
                self.peer_goaway = true;
                on(Event::GoAway {
                    last: be32(p, 0) & 0x7fff_ffff,
                    code: ErrorCode(be32(p, 4)),
                });
                Ok(())
            }
            frame::WINDOW_UPDATE => self.window_update(h, p, on),
            // §8.4: a client cannot push.
            frame::PUSH_PROMISE => Err(self.fail(ErrorCode::PROTOCOL_ERROR, Reason::Protocol)),
            // §4.1, §5.5: unknown types are ignored.
            _ => Ok(()),
        }
    }

    /// A stream error (§5.4.2): RST_STREAM queued, the stream forgotten, the
    /// caller told if it had the stream.
    pub(super) fn stream_error(
        &mut self,
        id: StreamId,
        code: ErrorCode,
        on: &mut impl FnMut(Event<'_>),
    ) -> Res {
        if let Some(s) = self.streams.close(id, Closed::ByServer) {
            self.conn_owed += s.held;
            on(Event::StreamError { id, code });
        }
        frame::put_rst(&mut self.out, id, code);
        if code == ErrorCode::REFUSED_STREAM {
            self.stats.refused_streams += 1;
        } else {
            self.stats.stream_errors += 1;
        }
        self.tick.stream_errors += 1;
        if self.tick.stream_errors > self.cfg.max_stream_errors_per_tick {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::StreamErrors));
        }
        self.control_queued(13)
    }

    /// An empty frame that ends nothing (CVE-2019-9518).
    pub(super) fn empty_frame(&mut self) -> Res {
        self.tick.empty += 1;
        if self.tick.empty > self.cfg.max_empty_frames_per_tick {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::EmptyFrames));
        }
        Ok(())
    }

    pub(super) fn protocol(&mut self) -> Res {
        Err(self.fail(ErrorCode::PROTOCOL_ERROR, Reason::Protocol))
    }

    /// A DATA frame's header (and Pad Length): windows, stream state and
    /// content-length checked before any byte is handed over (§6.1, §8.1.1).
    fn data_head(&mut self, h: Head, pad: Option<u8>, on: &mut impl FnMut(Event<'_>)) -> Res {
        if h.id == 0 {
            return self.protocol();
        }
        let pad = pad.map_or(0, usize::from);
        let padded = usize::from(h.flags & PADDED != 0);
        if padded == 1 && pad >= h.len {
            // §6.1: padding as long as the payload or longer.
            return self.protocol();
        }
        let len = h.len - padded - pad;
        let es = h.flags & END_STREAM != 0;
        // §6.9: the whole payload counts against the connection window.
        self.conn_recv -= h.len as i64;
        if self.conn_recv < 0 {
            return Err(self.fail(ErrorCode::FLOW_CONTROL_ERROR, Reason::FlowControl));
        }
        let mut deliver = false;
        let mut error = None;
        match self.streams.get(h.id) {
            Some(s) if s.flags & RECV_CLOSED == 0 => {
                s.recv -= h.len as i32;
                if s.recv < 0 {
                    error = Some(ErrorCode::FLOW_CONTROL_ERROR);
                } else if s.body_left != u64::MAX
                    && (len as u64 > s.body_left || (es && len as u64 != s.body_left))
                {
                    error = Some(ErrorCode::PROTOCOL_ERROR);
                } else {
                    if s.body_left != u64::MAX {
                        s.body_left -= len as u64;
                    }
                    s.held += len as u32;
                    // Padding is nobody's to release: owed back at once.
                    s.owed += (h.len - len) as u32;
                    deliver = true;
                    if es {
                        s.flags |= RECV_CLOSED;
                        if s.flags & SEND_CLOSED != 0 {
                            let id = h.id;
                            if let Some(s) = self.streams.close(id, Closed::Done) {
                                self.conn_owed += s.held;
                            }
                        }
                    }
                }
            }
            // §5.1: half-closed (remote).
            Some(_) => error = Some(ErrorCode::STREAM_CLOSED),
            None => match self.streams.state(h.id) {
                // §5.1: idle.
                Past::Idle => return self.protocol(),
                // §5.1: the client ended or reset it; or it was skipped (§5.1.1).
                Past::Closed(Closed::ByClient | Closed::Done) | Past::Skipped => {
                    error = Some(ErrorCode::STREAM_CLOSED)
                }
                // §5.1: frames after our RST_STREAM are ignored; so are those
                // on a stream too old to tell.
                Past::Closed(Closed::ByServer) | Past::Forgotten => {}
            },
        }
        if deliver {
            self.conn_owed += (h.len - len) as u32;
        } else {
            self.conn_owed += h.len as u32;
        }
        if let Some(code) = error {
            self.stream_error(h.id, code, on)?;
        }
        if len == 0 && !es {
            self.empty_frame()?;
        }
        if len == 0 && pad == 0 {
            if deliver && es {
                on(Event::Data {
                    id: h.id,
                    data: &[],
                    end_stream: true,
                });
            }
        } else {
            self.data = Some(DataLeft {
                id: h.id,
                left: len,
                pad,
                end_stream: es,
                deliver,
            });
        }
        self.credit_connection();
        Ok(())
    }

    /// PRIORITY (§6.3): checked, then ignored (RFC 9113 deprecates the scheme, §5.3.2).
    fn priority(&mut self, h: Head, p: &[u8], on: &mut impl FnMut(Event<'_>)) -> Res {
        if h.id == 0 {
            return self.protocol();
        }
        if p.len() != 5 {
            return self.stream_error(h.id, ErrorCode::FRAME_SIZE_ERROR, on);
        }
        if be32(p, 0) & 0x7fff_ffff == h.id {
            // §5.3.1: a stream cannot depend on itself.
            return self.stream_error(h.id, ErrorCode::PROTOCOL_ERROR, on);
        }
        Ok(())
    }

    /// RST_STREAM (§6.4).
    fn rst_stream(&mut self, h: Head, p: &[u8], on: &mut impl FnMut(Event<'_>)) -> Res {
        if p.len() != 4 {
            return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
        }
        if h.id == 0 || (h.id > self.streams.max_seen) {
            // On stream 0 or an idle stream.
            return self.protocol();
        }
        let Some(s) = self.streams.close(h.id, Closed::ByClient) else {
            return Ok(());
        };
        self.conn_owed += s.held;
        self.stats.client_resets += 1;
        let code = ErrorCode(be32(p, 0));
        on(Event::Reset { id: h.id, code });
        self.tick.resets += 1;
        if self.tick.resets > self.cfg.max_resets_per_tick {
            // CVE-2023-44487.
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::RapidReset));
        }
        self.credit_connection();
        Ok(())
    }

    /// SETTINGS (§6.5): validated, applied, acknowledged.
    fn settings(&mut self, h: Head, p: &[u8], on: &mut impl FnMut(Event<'_>)) -> Res {
        if h.id != 0 {
            return self.protocol();
        }
        if h.flags & ACK != 0 {
            if !p.is_empty() {
                return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
            }
            self.acked = true;
            return Ok(());
        }
        if !p.len().is_multiple_of(6) {
            return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
        }
        self.tick.settings += 1;
        if self.tick.settings > self.cfg.max_settings_per_tick {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::SettingsFlood));
        }
        let mut opened = false;
        for s in p.chunks_exact(6) {
            let v = be32(s, 2);
            match u16::from_be_bytes([s[0], s[1]]) {
                frame::SETTINGS_HEADER_TABLE_SIZE => self.encoder.set_peer_max_table(v as usize),
                frame::SETTINGS_ENABLE_PUSH if v > 1 => return self.protocol(),
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(v) > MAX_WINDOW {
                        return Err(self.fail(ErrorCode::FLOW_CONTROL_ERROR, Reason::FlowControl));
                    }
                    // §6.9.2: every stream's send window moves by the change.
                    let delta = i64::from(v) - i64::from(self.peer_initial_window);
                    self.peer_initial_window = v;
                    let mut over = false;
                    for st in self.streams.iter_mut() {
                        st.send += delta;
                        over |= st.send > MAX_WINDOW;
                    }
                    if over {
                        return Err(self.fail(ErrorCode::FLOW_CONTROL_ERROR, Reason::FlowControl));
                    }
                    opened |= delta > 0;
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(frame::MIN_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE).contains(&v) {
                        return self.protocol();
                    }
                    self.peer_max_frame = v;
                }
                // Push is never used; the client's list limit is the caller's to honour.
                _ => {}
            }
        }
        frame::put_head(&mut self.out, 0, frame::SETTINGS, ACK, 0);
        if opened && !self.streams.is_empty() {
            on(Event::WindowOpen { id: None });
        }
        self.control_queued(9)
    }

    /// PING (§6.7): answered with the same payload.
    fn ping(&mut self, h: Head, p: &[u8]) -> Res {
        if p.len() != 8 {
            return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
        }
        if h.id != 0 {
            return self.protocol();
        }
        let payload: [u8; 8] = p.try_into().unwrap_or_default();
        if h.flags & ACK != 0 {
            if payload == SHUTDOWN_PING && self.shutdown == Shutdown::Pinged {
                // §6.8: the streams the client started meanwhile are in; now the last one.
                frame::put_goaway(&mut self.out, self.streams.last_taken, ErrorCode::NO_ERROR);
                self.shutdown = Shutdown::Final;
            }
            return Ok(());
        }
        self.tick.pings += 1;
        if self.tick.pings > self.cfg.max_pings_per_tick {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::PingFlood));
        }
        frame::put_ping(&mut self.out, true, &payload);
        self.control_queued(17)
    }

    /// WINDOW_UPDATE (§6.9).
    fn window_update(&mut self, h: Head, p: &[u8], on: &mut impl FnMut(Event<'_>)) -> Res {
        if p.len() != 4 {
            return Err(self.fail(ErrorCode::FRAME_SIZE_ERROR, Reason::FrameSize));
        }
        let inc = i64::from(be32(p, 0) & 0x7fff_ffff);
        if h.id == 0 {
            if inc == 0 {
                return self.protocol();
            }
            self.conn_send += inc;
            if self.conn_send > MAX_WINDOW {
                return Err(self.fail(ErrorCode::FLOW_CONTROL_ERROR, Reason::FlowControl));
            }
            on(Event::WindowOpen { id: None });
            return Ok(());
        }
        if h.id > self.streams.max_seen {
            // §5.1: WINDOW_UPDATE on an idle stream.
            return self.protocol();
        }
        let Some(s) = self.streams.get(h.id) else {
            return Ok(());
        };
        if inc == 0 {
            return self.stream_error(h.id, ErrorCode::PROTOCOL_ERROR, on);
        }
        s.send += inc;
        if s.send > MAX_WINDOW {
            return self.stream_error(h.id, ErrorCode::FLOW_CONTROL_ERROR, on);
        }
        on(Event::WindowOpen { id: Some(h.id) });
        Ok(())
    }
}
