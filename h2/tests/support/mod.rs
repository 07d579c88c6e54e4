//! What the server tests share: a frame writer, a literal-only HPACK writer, a connection driven as a client would (the unused tail kept and fed again), the events made owned, and the server's frames parsed.

#![allow(dead_code, unused_imports)]

pub use zgix_h2::frame::*;
pub use zgix_h2::server::{Config, ConnError, Event, Reason, Server};
#[allow(unused_imports)]
pub use zgix_h2::server::{ErrorCode as Code, Stats};

pub fn frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    put_head(&mut b, payload.len(), kind, flags, id);
    b.extend_from_slice(payload);
    b
}

/// A literal field without indexing, its name a literal (RFC 7541 §6.2.2).
pub fn lit(b: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    b.push(0);
    int7(b, name.len());
    b.extend_from_slice(name);
    int7(b, value.len());
    b.extend_from_slice(value);
}

/// A literal field with incremental indexing (§6.2.1).
pub fn lit_indexed(b: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    b.push(0x40);
    int7(b, name.len());
    b.extend_from_slice(name);
    int7(b, value.len());
    b.extend_from_slice(value);
}

fn int7(b: &mut Vec<u8>, mut v: usize) {
    if v < 127 {
        b.push(v as u8);
        return;
    }
    b.push(127);
    v -= 127;
    while v >= 128 {
        b.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// A GET of `path`: :method GET and :scheme http by static index, the rest literal.
pub fn get(path: &str) -> Vec<u8> {
    let mut b = vec![0x82, 0x86];
    lit(&mut b, b":path", path.as_bytes());
    lit(&mut b, b":authority", b"site.example");
    b
}

pub fn post(len: Option<&str>) -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    lit(&mut b, b":path", b"/up");
    lit(&mut b, b":authority", b"site.example");
    if let Some(l) = len {
        lit(&mut b, b"content-length", l.as_bytes());
    }
    b
}

pub fn headers(id: u32, block: &[u8], end_stream: bool) -> Vec<u8> {
    let es = if end_stream { END_STREAM } else { 0 };
    frame(HEADERS, END_HEADERS | es, id, block)
}

/// An event, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ev {
    Request {
        id: u32,
        method: Vec<u8>,
        path: Option<Vec<u8>>,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
        end: bool,
    },
    Data {
        id: u32,
        data: Vec<u8>,
        end: bool,
    },
    Trailers {
        id: u32,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Reset {
        id: u32,
        code: u32,
    },
    StreamError {
        id: u32,
        code: u32,
    },
    WindowOpen(Option<u32>),
    GoAway {
        last: u32,
        code: u32,
    },
}

pub fn own(e: Event<'_>) -> Ev {
    let fields = |f: zgix_h2::server::Fields<'_>| {
        f.iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect::<Vec<_>>()
    };
    match e {
        Event::Request {
            id,
            head,
            end_stream,
        } => Ev::Request {
            id,
            method: head.method.to_vec(),
            path: head.path.map(|p| p.to_vec()),
            fields: fields(head.fields),
            end: end_stream,
        },
        Event::Data {
            id,
            data,
            end_stream,
        } => Ev::Data {
            id,
            data: data.to_vec(),
            end: end_stream,
        },
        Event::Trailers { id, fields: f } => Ev::Trailers {
            id,
            fields: fields(f),
        },
        Event::Reset { id, code } => Ev::Reset { id, code: code.0 },
        Event::StreamError { id, code } => Ev::StreamError { id, code: code.0 },
        Event::WindowOpen { id } => Ev::WindowOpen(id),
        Event::GoAway { last, code } => Ev::GoAway { last, code: code.0 },
    }
}

/// Adjacent DATA pieces of one stream joined (what a frame's pieces make).
pub fn joined(evs: &[Ev]) -> Vec<Ev> {
    let mut out: Vec<Ev> = Vec::new();
    for e in evs {
        if let (
            Some(Ev::Data {
                id: a,
                data: d,
                end: false,
            }),
            Ev::Data { id: b, data, end },
        ) = (out.last_mut(), e)
        {
            if a == b {
                d.extend_from_slice(data);
                let end = *end;
                let (id, data) = (*a, std::mem::take(d));
                *out.last_mut().unwrap() = Ev::Data { id, data, end };
                continue;
            }
        }
        out.push(e.clone());
    }
    out
}

/// A frame the server sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub kind: u8,
    pub flags: u8,
    pub id: u32,
    pub payload: Vec<u8>,
}

impl Out {
    /// A RST_STREAM's code, or a GOAWAY's.
    pub fn code(&self) -> u32 {
        match self.kind {
            RST_STREAM => be32(&self.payload, 0),
            GOAWAY => be32(&self.payload, 4),
            _ => u32::MAX,
        }
    }
    pub fn last(&self) -> u32 {
        be32(&self.payload, 0)
    }
}

pub fn parse_frames(mut b: &[u8]) -> Vec<Out> {
    let mut v = Vec::new();
    while let Some(h) = Head::parse(b) {
        assert!(b.len() >= 9 + h.len, "a cut frame");
        v.push(Out {
            kind: h.kind,
            flags: h.flags,
            id: h.id,
            payload: b[9..9 + h.len].to_vec(),
        });
        b = &b[9 + h.len..];
    }
    assert!(b.is_empty());
    v
}

/// A connection seen from the client.
pub struct Client {
    pub s: Server,
    /// Bytes the server did not use yet.
    pub tail: Vec<u8>,
    pub events: Vec<Ev>,
    pub err: Option<ConnError>,
}

impl Client {
    /// Preface and an empty SETTINGS sent; the server's SETTINGS and ACK taken.
    pub fn open(cfg: Config) -> Client {
        let mut c = Client::bare(cfg);
        c.send(PREFACE);
        c.send(&frame(SETTINGS, 0, 0, &[]));
        let out = c.out();
        assert_eq!(out[0].kind, SETTINGS);
        assert!(out.iter().any(|f| f.kind == SETTINGS && f.flags == ACK));
        c.send(&frame(SETTINGS, ACK, 0, &[]));
        c
    }

    pub fn bare(cfg: Config) -> Client {
        Client {
            s: Server::new(cfg),
            tail: Vec::new(),
            events: Vec::new(),
            err: None,
        }
    }

    /// Feeds bytes as they would arrive after the unused tail.
    pub fn send(&mut self, b: &[u8]) {
        self.tail.extend_from_slice(b);
        let ev = &mut self.events;
        match self.s.recv(&self.tail, &mut |e| ev.push(own(e))) {
            Ok(n) => {
                self.tail.drain(..n);
            }
            Err(e) => {
                self.err.get_or_insert(e);
                self.tail.clear();
            }
        }
    }

    /// The frames the server queued, taken.
    pub fn out(&mut self) -> Vec<Out> {
        let p = self.s.pending().to_vec();
        self.s.written(p.len());
        parse_frames(&p)
    }

    pub fn take_events(&mut self) -> Vec<Ev> {
        std::mem::take(&mut self.events)
    }

    /// The GOAWAY queued: (last stream, code).
    #[track_caller]
    pub fn goaway(&mut self) -> (u32, u32) {
        let out = self.out();
        let g = out
            .iter()
            .find(|f| f.kind == GOAWAY)
            .unwrap_or_else(|| panic!("no GOAWAY in {out:?}"));
        assert!(self.err.is_some(), "recv did not fail");
        (g.last(), g.code())
    }

    /// The RST_STREAM queued for `id`: its code; the connection goes on.
    #[track_caller]
    pub fn rst(&mut self, id: u32) -> u32 {
        let out = self.out();
        assert!(self.err.is_none(), "{:?}: {out:?}", self.err);
        out.iter()
            .find(|f| f.kind == RST_STREAM && f.id == id)
            .unwrap_or_else(|| panic!("no RST_STREAM on {id} in {out:?}"))
            .code()
    }
}
