//! The streams of a connection (RFC 9113 §5.1): the open and half-closed ones in a vector sorted by id (client ids only grow, §5.1.1), the highest id seen, and a small ring of the latest closed ones with how they closed (what a late frame on them means).

use std::collections::VecDeque;

use crate::frame::StreamId;

/// The client sent END_STREAM (half-closed remote, §5.1).
pub(super) const RECV_CLOSED: u8 = 0x1;
/// The server sent END_STREAM (half-closed local).
pub(super) const SEND_CLOSED: u8 = 0x2;
/// The response's HEADERS were sent.
pub(super) const ANSWERED: u8 = 0x4;

/// An open or half-closed stream.
#[derive(Clone, Debug)]
pub(super) struct Stream {
    pub id: StreamId,
    pub flags: u8,
    /// What the client may still send (§6.9).
    pub recv: i32,
    /// DATA handed to the caller and not yet released.
    pub held: u32,
    /// What the caller released and WINDOW_UPDATE has not given back.
    pub owed: u32,
    /// What the server may still send; negative after a smaller
    /// SETTINGS_INITIAL_WINDOW_SIZE (§6.9.2).
    pub send: i64,
    /// Body bytes content-length still allows (§8.1.1); `u64::MAX`: no content-length.
    pub body_left: u64,
}

/// How a remembered stream closed.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(super) enum Closed {
    /// Both sides ended it.
    Done,
    /// The client reset it.
    ByClient,
    /// The server reset it (frames in flight are ignored, §5.1).
    ByServer,
}

/// What a stream not open is.
#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(super) enum Past {
    /// Above every id used (§5.1).
    Idle,
    /// Closed, and how, remembered.
    Closed(Closed),
    /// Below an id used and never opened itself: closed by that (§5.1.1).
    Skipped,
    /// Opened once, or too far below the latest to tell.
    Forgotten,
}

/// Closed streams remembered.
const RING: usize = 16;

/// Emptied stream deques a thread keeps for its connections.
const SPARE_DEQUES: usize = 16;

/// The longest emptied deque kept.
const SPARE_KEPT: usize = 256;

thread_local! {
    /// Emptied stream deques: a connection holds one only while a stream
    /// is open, and its next burst does not grow one from nothing (a
    /// thread-per-core server's connections share its thread's spares).
    static SPARE: std::cell::RefCell<Vec<VecDeque<Stream>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The connection's streams.
#[derive(Default)]
pub(super) struct Streams {
    /// Sorted by id; a deque, since streams mostly end in the order they began.
    open: VecDeque<Stream>,
    /// The highest stream id the client used (§5.1.1): any lower one not
    /// open is closed.
    pub max_seen: StreamId,
    /// Which of the 128 client ids up to `max_seen` were opened: bit k for
    /// `max_seen - 2k`.
    opened: u128,
    /// The highest stream handed to the caller: GOAWAY's last stream (§6.8).
    pub last_taken: StreamId,
    /// The latest closed streams and how each closed.
    ring: [StreamId; RING],
    how: [Option<Closed>; RING],
    next: u8,
}

impl Streams {
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn heap_bytes(&self) -> usize {
        self.open.capacity() * std::mem::size_of::<Stream>()
    }

    /// Gives the deque up while no stream is open: to the thread's spares
    /// (with its room, for the next connection's burst), or freed.
    pub fn shrink(&mut self) {
        if self.open.is_empty() && self.open.capacity() > 0 {
            let spare = std::mem::take(&mut self.open);
            if spare.capacity() <= SPARE_KEPT {
                let _ = SPARE.try_with(|p| {
                    let mut p = p.borrow_mut();
                    if p.len() < SPARE_DEQUES {
                        p.push(spare);
                    }
                });
            }
        }
    }

    #[inline]
    fn find(&self, id: StreamId) -> Result<usize, usize> {
        // The newest streams are the likeliest: look at the last first.
        match (self.open.front(), self.open.back()) {
            (_, Some(s)) if s.id == id => Ok(self.open.len() - 1),
            (_, Some(s)) if s.id < id => Err(self.open.len()),
            (Some(s), _) if s.id == id => Ok(0),
            _ => self.open.binary_search_by_key(&id, |s| s.id),
        }
    }

    pub fn get(&mut self, id: StreamId) -> Option<&mut Stream> {
        let i = self.find(id).ok()?;
        Some(&mut self.open[i])
    }

    pub fn get_ref(&self, id: StreamId) -> Option<&Stream> {
        let i = self.find(id).ok()?;
        Some(&self.open[i])
    }

    /// Opens a stream above every other.
    pub fn insert(&mut self, s: Stream) {
        debug_assert!(self.open.back().is_none_or(|l| l.id < s.id));
        if self.open.capacity() == 0 {
            if let Some(spare) = SPARE.with(|p| p.borrow_mut().pop()) {
                self.open = spare;
            }
        }
        self.open.push_back(s);
    }

    /// Closes a stream (if open) and remembers how.
    pub fn close(&mut self, id: StreamId, how: Closed) -> Option<Stream> {
        let s = self.find(id).ok().and_then(|i| self.open.remove(i));
        self.remember(id, how);
        s
    }

    /// Remembers a stream closed (even one never opened, as when refused).
    pub fn remember(&mut self, id: StreamId, how: Closed) {
        self.ring[usize::from(self.next)] = id;
        self.how[usize::from(self.next)] = Some(how);
        self.next = (self.next + 1) % RING as u8;
    }

    /// A new client stream's HEADERS came: it is the highest now.
    pub fn open_id(&mut self, id: StreamId) {
        let shift = (id - self.max_seen) / 2;
        self.opened = if shift >= 128 {
            0
        } else {
            self.opened << shift
        };
        self.opened |= 1;
        self.max_seen = id;
    }

    /// What a stream that is not open is.
    pub fn state(&self, id: StreamId) -> Past {
        if id > self.max_seen {
            return Past::Idle;
        }
        if let Some(how) = self.closed(id) {
            return Past::Closed(how);
        }
        let k = (self.max_seen - id) / 2;
        if k < 128 && self.opened & (1 << k) == 0 {
            Past::Skipped
        } else {
            Past::Forgotten
        }
    }

    /// How a closed stream closed, if it is still remembered (the latest wins).
    pub fn closed(&self, id: StreamId) -> Option<Closed> {
        if id == 0 {
            return None;
        }
        (0..RING)
            .map(|k| (usize::from(self.next) + RING - 1 - k) % RING)
            .find(|&i| self.ring[i] == id)
            .and_then(|i| self.how[i])
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Stream> {
        self.open.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: StreamId) -> Stream {
        Stream {
            id,
            flags: 0,
            recv: 0,
            held: 0,
            owed: 0,
            send: 0,
            body_left: u64::MAX,
        }
    }

    #[test]
    fn streams_are_found_closed_and_remembered() {
        let mut t = Streams::default();
        for id in [1, 3, 5, 9] {
            t.insert(s(id));
        }
        assert!(t.get(3).is_some() && t.get(7).is_none() && t.get(11).is_none());
        assert_eq!(t.close(3, Closed::ByClient).map(|s| s.id), Some(3));
        assert!(t.get(3).is_none());
        assert_eq!(t.closed(3), Some(Closed::ByClient));
        assert_eq!(t.closed(5), None);
        t.close(3, Closed::ByServer);
        assert_eq!(t.closed(3), Some(Closed::ByServer), "the latest wins");
        for id in 0..RING as u32 {
            t.remember(101 + 2 * id, Closed::Done);
        }
        assert_eq!(t.closed(3), None, "forgotten past the ring");
        assert_eq!(t.closed(101), Some(Closed::Done));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn ids_below_the_highest_are_skipped_or_opened_or_too_old_to_tell() {
        let mut t = Streams::default();
        assert_eq!(t.state(1), Past::Idle);
        t.open_id(1);
        t.open_id(5);
        assert_eq!(t.state(3), Past::Skipped);
        assert_eq!(t.state(1), Past::Forgotten, "opened, closed unremembered");
        assert_eq!(t.state(7), Past::Idle);
        t.remember(1, Closed::Done);
        assert_eq!(t.state(1), Past::Closed(Closed::Done));
        t.open_id(5 + 2 * 127);
        assert_eq!(t.state(5), Past::Forgotten, "bit 127");
        assert_eq!(t.state(7), Past::Skipped);
        t.open_id(5 + 2 * 128);
        assert_eq!(t.state(7), Past::Skipped, "bit 127");
        assert_eq!(t.state(5), Past::Forgotten, "past the window");
        t.open_id(0x7fff_ffff);
        assert_eq!(t.state(0x7fff_fffd), Past::Skipped);
    }
}
