//! The sans-I/O HTTP/2 server connection (RFC 9113): [`Server`] takes the client's bytes in [`Server::recv`] and hands out [`Event`]s; what it writes (SETTINGS, ACKs, WINDOW_UPDATE, RST_STREAM, GOAWAY, responses) waits in one buffer the caller drains with [`Server::pending`] and [`Server::written`]. Reading is in `recv` (frames), `block` (header blocks) and `request` (§8 validation); writing in `send`; streams and their windows in `streams`.

mod block;
mod recv;
mod request;
mod send;
mod streams;

pub use crate::frame::{ErrorCode, StreamId};
pub use request::{Fields, FieldsIter, RequestHead};

use crate::frame::{self, put_setting, DEFAULT_WINDOW, MIN_MAX_FRAME_SIZE};
use crate::hpack;
use streams::Streams;

/// What the server advertises and the limits it keeps. The flood limits
/// count per tick: the caller calls [`Server::tick`] once a second.
#[derive(Copy, Clone, Debug)]
pub struct Config {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (§5.1.2): one more is refused with
    /// RST_STREAM `REFUSED_STREAM`.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: each stream's receive window (§6.9.2).
    pub initial_window: u32,
    /// The connection's receive window (65,535 at the start, §6.9.2; a
    /// larger one is opened with a WINDOW_UPDATE in the preface).
    pub connection_window: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE (§6.5.2): a larger list is answered 431;
    /// a header block over CONTINUATION frames larger than this (compressed)
    /// ends the connection with `ENHANCE_YOUR_CALM` (CVE-2024-27316).
    pub max_header_list: u32,
    /// SETTINGS_MAX_FRAME_SIZE: frames over it are `FRAME_SIZE_ERROR` (§4.2).
    pub max_frame_size: u32,
    /// SETTINGS_HEADER_TABLE_SIZE: the HPACK decoder's table bound.
    pub header_table_size: u32,
    /// PINGs (not ACKs) per tick before GOAWAY `ENHANCE_YOUR_CALM` (CVE-2019-9512).
    pub max_pings_per_tick: u32,
    /// SETTINGS frames (not ACKs) per tick, likewise (CVE-2019-9515).
    pub max_settings_per_tick: u32,
    /// Streams the client resets after opening them, per tick (rapid reset, CVE-2023-44487).
    pub max_resets_per_tick: u32,
    /// Streams zgix resets or refuses for the client's errors, per tick.
    pub max_stream_errors_per_tick: u32,
    /// Empty DATA and CONTINUATION frames that end nothing, per tick (CVE-2019-9518).
    pub max_empty_frames_per_tick: u32,
    /// CONTINUATION frames in one header block.
    pub max_continuations: u32,
    /// Bytes of frames queued in answer to the client's (ACKs, RST_STREAM,
    /// WINDOW_UPDATE) not yet written: past it, GOAWAY `ENHANCE_YOUR_CALM`
    /// (the client does not read what it asks for, CVE-2019-9512/9515).
    pub max_pending_control: u32,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_concurrent_streams: 128,
            initial_window: DEFAULT_WINDOW,
            connection_window: DEFAULT_WINDOW,
            max_header_list: 65_536,
            max_frame_size: MIN_MAX_FRAME_SIZE,
            header_table_size: 4096,
            max_pings_per_tick: 100,
            max_settings_per_tick: 100,
            max_resets_per_tick: 200,
            max_stream_errors_per_tick: 100,
            max_empty_frames_per_tick: 100,
            max_continuations: 64,
            max_pending_control: 16_384,
        }
    }
}

/// Why the connection ended on what the client sent (the proxy counts by it).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Not the client preface (§3.4).
    BadPreface,
    /// A frame or sequence RFC 9113 forbids (`PROTOCOL_ERROR`, `STREAM_CLOSED`).
    Protocol,
    /// `FRAME_SIZE_ERROR`.
    FrameSize,
    /// `FLOW_CONTROL_ERROR`.
    FlowControl,
    /// A header block HPACK cannot decode (`COMPRESSION_ERROR`).
    Hpack,
    PingFlood,
    SettingsFlood,
    RapidReset,
    /// Too many streams reset for the client's errors in a tick.
    StreamErrors,
    /// Too many empty DATA or CONTINUATION frames in a tick.
    EmptyFrames,
    /// A header block over CONTINUATION frames too large or in too many frames.
    HeaderFlood,
    /// Answers to the client's frames queued faster than it reads them.
    ControlBacklog,
    /// The caller ended it with [`Server::go_away`].
    Local,
}

/// The connection is over: a GOAWAY with `code` is queued (write out
/// [`Server::pending`], then close).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnError {
    pub code: ErrorCode,
    pub reason: Reason,
}

/// The stream is not (or no longer) one the caller may send on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct StreamGone;

/// What the client's frames meant.
#[derive(Debug)]
pub enum Event<'a> {
    /// A new request, decoded and validated (§8.2, §8.3).
    Request {
        id: StreamId,
        head: &'a RequestHead<'a>,
        end_stream: bool,
    },
    /// Request body bytes, possibly a piece of a DATA frame. Call
    /// [`Server::release`] once they are consumed.
    Data {
        id: StreamId,
        data: &'a [u8],
        end_stream: bool,
    },
    /// Trailers (they end the stream).
    Trailers { id: StreamId, fields: Fields<'a> },
    /// The client reset the stream.
    Reset { id: StreamId, code: ErrorCode },
    /// The server reset the stream for the client's error (RST_STREAM queued): drop it.
    StreamError { id: StreamId, code: ErrorCode },
    /// A send window opened: the stream's, or the connection's (`None`).
    WindowOpen { id: Option<StreamId> },
    /// The client sent GOAWAY.
    GoAway { last: StreamId, code: ErrorCode },
}

/// Counts of what the server refused, for the proxy's metrics.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// RST_STREAM `REFUSED_STREAM` sent (over max_concurrent_streams).
    pub refused_streams: u64,
    /// RST_STREAM sent for a client's error (malformed request, a frame on
    /// a closed stream, a window error).
    pub stream_errors: u64,
    /// 431 answers to header lists over max_header_list.
    pub headers_too_large: u64,
    /// Streams the client reset.
    pub client_resets: u64,
}

/// Flood counters of the current tick.
#[derive(Default)]
struct Tick {
    pings: u32,
    settings: u32,
    resets: u32,
    stream_errors: u32,
    empty: u32,
}

/// The PING payload of a graceful shutdown (§6.8).
const SHUTDOWN_PING: [u8; 8] = *b"zgix-bye";

/// Where the graceful shutdown is.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Shutdown {
    No,
    /// GOAWAY with 2^31-1 and a PING sent; waiting for its ACK.
    Pinged,
    /// GOAWAY with the last stream sent: no stream above it is taken.
    Final,
}

/// A sans-I/O HTTP/2 server connection.
pub struct Server {
    cfg: Config,
    /// Bytes of the client preface still to check.
    preface_left: u8,
    /// The client's first SETTINGS came (§3.4: the preface ends with it).
    peer_settings: bool,
    /// A connection error ended the connection.
    dead: Option<ConnError>,
    /// The client sent GOAWAY: it opens no more streams (§6.8).
    peer_goaway: bool,
    shutdown: Shutdown,
    /// What is queued to write: `out[sent..]`.
    out: Vec<u8>,
    sent: usize,
    /// Bytes of answers to the client's frames not yet written (a bound).
    ctrl: usize,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    /// The client's settings.
    peer_max_frame: u32,
    peer_initial_window: u32,
    /// Our SETTINGS were acknowledged.
    acked: bool,
    /// The connection's windows.
    conn_send: i64,
    conn_recv: i64,
    /// Received bytes consumed and not yet given back with WINDOW_UPDATE.
    conn_owed: u32,
    streams: Streams,
    /// A DATA frame whose payload is still coming (§6.1).
    data: Option<recv::DataLeft>,
    /// A header block over CONTINUATION frames (§6.10).
    block: Option<block::Open>,
    /// Decoded fields of the current request or trailers.
    scratch: Vec<u8>,
    tick: Tick,
    stats: Stats,
}

impl Server {
    /// A server connection; the server preface (SETTINGS, §3.4) is queued.
    pub fn new(mut cfg: Config) -> Server {
        cfg.max_frame_size = cfg
            .max_frame_size
            .clamp(MIN_MAX_FRAME_SIZE, frame::MAX_MAX_FRAME_SIZE);
        cfg.initial_window = cfg.initial_window.min(frame::MAX_WINDOW as u32);
        cfg.connection_window = cfg
            .connection_window
            .clamp(DEFAULT_WINDOW, frame::MAX_WINDOW as u32);
        let mut s = Server {
            cfg,
            preface_left: frame::PREFACE.len() as u8,
            peer_settings: false,
            dead: None,
            peer_goaway: false,
            shutdown: Shutdown::No,
            out: Vec::new(),
            sent: 0,
            ctrl: 0,
            decoder: hpack::Decoder::new(cfg.header_table_size as usize),
            encoder: hpack::Encoder::new(),
            peer_max_frame: MIN_MAX_FRAME_SIZE,
            peer_initial_window: DEFAULT_WINDOW,
            acked: false,
            conn_send: i64::from(DEFAULT_WINDOW),
            conn_recv: i64::from(cfg.connection_window),
            conn_owed: 0,
            streams: Streams::default(),
            data: None,
            block: None,
            scratch: Vec::new(),
            tick: Tick::default(),
            stats: Stats::default(),
        };
        s.preface();
        s
    }

    /// SETTINGS (§6.5): what differs from the defaults, and push off; then
    /// the connection window's opening (§6.9.2).
    fn preface(&mut self) {
        let c = self.cfg;
        let at = self.out.len();
        frame::put_head(&mut self.out, 0, frame::SETTINGS, 0, 0);
        let o = &mut self.out;
        put_setting(o, frame::SETTINGS_ENABLE_PUSH, 0);
        put_setting(
            o,
            frame::SETTINGS_MAX_CONCURRENT_STREAMS,
            c.max_concurrent_streams,
        );
        if c.initial_window != DEFAULT_WINDOW {
            put_setting(o, frame::SETTINGS_INITIAL_WINDOW_SIZE, c.initial_window);
        }
        if c.max_frame_size != MIN_MAX_FRAME_SIZE {
            put_setting(o, frame::SETTINGS_MAX_FRAME_SIZE, c.max_frame_size);
        }
        if c.header_table_size != 4096 {
            put_setting(o, frame::SETTINGS_HEADER_TABLE_SIZE, c.header_table_size);
        }
        put_setting(o, frame::SETTINGS_MAX_HEADER_LIST_SIZE, c.max_header_list);
        let len = self.out.len() - at - 9;
        frame::set_len(&mut self.out, at, len);
        if c.connection_window > DEFAULT_WINDOW {
            frame::put_window_update(&mut self.out, 0, c.connection_window - DEFAULT_WINDOW);
        }
    }

    /// Frames to write to the client.
    pub fn pending(&self) -> &[u8] {
        &self.out[self.sent..]
    }

    /// The caller wrote `n` bytes of [`Server::pending`]. Once all is
    /// written the buffer is freed when no stream is open (an idle
    /// connection holds nothing here), and kept for the next frames otherwise.
    pub fn written(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.out.len());
        self.ctrl = self.ctrl.saturating_sub(n);
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
            self.ctrl = 0;
            if self.streams.is_empty() && self.block.is_none() {
                self.out = Vec::new();
                self.scratch = Vec::new();
                self.streams.shrink();
            } else if self.out.capacity() > 256 * 1024 {
                self.out = Vec::new();
            }
        } else if self.sent > 64 * 1024 && self.sent * 2 > self.out.len() {
            self.out.drain(..self.sent);
            self.sent = 0;
        }
    }

    /// Starts a new tick of the flood counters (call once a second).
    pub fn tick(&mut self) {
        self.tick = Tick::default();
    }

    /// Streams open (or half-closed) now.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Bytes this connection holds on the heap now, its HPACK decoder's included.
    pub fn heap_bytes(&self) -> usize {
        self.out.capacity()
            + self.scratch.capacity()
            + self.streams.heap_bytes()
            + self.block.as_ref().map_or(0, |b| b.heap_bytes())
            + self.decoder.heap_bytes()
    }

    /// What the server refused so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The connection error that ended the connection, if one did.
    pub fn error(&self) -> Option<ConnError> {
        self.dead
    }

    /// Whether the caller may close the connection once `pending` is
    /// written: it ended with an error, or no stream is open after the
    /// server's final GOAWAY or the client's.
    pub fn is_done(&self) -> bool {
        self.dead.is_some()
            || ((self.shutdown == Shutdown::Final || self.peer_goaway) && self.streams.is_empty())
    }

    /// Ends the connection: GOAWAY with `code` and the last stream the
    /// server took (§6.8). No stream is taken after it; with `NO_ERROR`
    /// the open ones may finish, with any other code the connection is over.
    pub fn go_away(&mut self, code: ErrorCode) {
        if self.dead.is_some() {
            return;
        }
        frame::put_goaway(&mut self.out, self.streams.last_taken, code);
        if code == ErrorCode::NO_ERROR {
            self.shutdown = Shutdown::Final;
        } else {
            self.dead = Some(ConnError {
                code,
                reason: Reason::Local,
            });
        }
    }

    /// A graceful shutdown (§6.8): GOAWAY `NO_ERROR` with 2^31-1 and a
    /// PING; once the PING's ACK comes, GOAWAY with the last stream taken.
    /// The streams in flight finish; [`Server::is_done`] says when all did.
    pub fn graceful_shutdown(&mut self) {
        if self.dead.is_some() || self.shutdown != Shutdown::No {
            return;
        }
        frame::put_goaway(&mut self.out, frame::MAX_WINDOW as u32, ErrorCode::NO_ERROR);
        frame::put_ping(&mut self.out, false, &SHUTDOWN_PING);
        self.shutdown = Shutdown::Pinged;
    }

    /// A connection error (§5.4.1): GOAWAY with the last stream taken.
    fn fail(&mut self, code: ErrorCode, reason: Reason) -> ConnError {
        let e = ConnError { code, reason };
        if self.dead.is_none() {
            frame::put_goaway(&mut self.out, self.streams.last_taken, code);
            self.dead = Some(e);
        }
        self.data = None;
        self.block = None;
        e
    }

    /// Queues an answer to the client's frame; past the backlog bound the
    /// connection ends instead.
    fn control_queued(&mut self, n: usize) -> Result<(), ConnError> {
        self.ctrl += n;
        if self.ctrl > self.cfg.max_pending_control as usize {
            return Err(self.fail(ErrorCode::ENHANCE_YOUR_CALM, Reason::ControlBacklog));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_lists_what_differs_from_the_defaults() {
        let s = Server::new(Config::default());
        let p = s.pending();
        let h = frame::Head::parse(p).unwrap();
        assert_eq!((h.kind, h.flags, h.id, h.len), (frame::SETTINGS, 0, 0, 18));
        assert_eq!(p.len(), 27);
        let c = Config {
            initial_window: 1 << 20,
            connection_window: 4 << 20,
            ..Config::default()
        };
        let s = Server::new(c);
        let h = frame::Head::parse(s.pending()).unwrap();
        assert_eq!(h.len, 24);
        let w = frame::Head::parse(&s.pending()[9 + 24..]).unwrap();
        assert_eq!((w.kind, w.len), (frame::WINDOW_UPDATE, 4));
    }
}
