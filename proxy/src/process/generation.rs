//! Configuration generations on a shard: the mailbox the main thread posts reloads, hand-offs and the drain to, and how a shard switches to a new runtime while connections of the old one finish on theirs.
//!
//! # Generations
//!
//! A reload builds a new [`Runtime`] on the main thread and posts it to
//! every shard's [`Mailbox`] with the listening sockets that shard serves
//! from now on. The shard makes a new [`Shard`](crate::conn::shard::Shard) around it (a *generation*)
//! and points every kept listener's accept loop at it, so connections
//! accepted from then on run on the new config. An accept loop holds no
//! generation while it waits. A connection keeps the `Rc<Shard>` it runs on
//! — and so the runtime, the listener index and the counters of its
//! generation — while a request runs on it; idle between requests it moves
//! to the newest generation ([`Shard::newest`](crate::conn::shard::Shard::newest), see
//! [`follow`](crate::conn::shard::follow)) as soon as a reload retires its
//! own, or when its next request's bytes arrive. Generations
//! do not reference each other (`newest` is weak), so a retired one is freed
//! as soon as no connection runs on it; [`Shard::retire`](crate::conn::shard::Shard::retire)
//! empties its upstream pool at once (idle connections move to the new
//! pool when it has an endpoint of the same address) and an upstream
//! connection returned to it later goes the same way. The request path never
//! locks and never looks the runtime up: a generation's runtime is fixed.
//!
//! What generations of one shard share (`Rc` fields of [`Shard`](crate::conn::shard::Shard)): the
//! connection count and its cap waiters, the gate the drain waits on, the
//! drain flag and the in-flight request count.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::io::Notifier;
use crate::runtime::Runtime;

/// A listening socket a shard serves under a generation.
#[derive(Debug)]
pub struct ListenerFd {
    /// The listener's `bind` as configured (its identity across reloads).
    pub key: SocketAddr,
    /// Its index in the new runtime's `listeners`.
    pub index: usize,
    /// A socket to start accepting on, owned by the shard from now on; `None`
    /// when the shard already accepts on one for `key`.
    pub fd: Option<RawFd>,
}

/// Everything a shard needs to switch to a new generation.
pub struct Update {
    pub generation: u64,
    pub rt: Arc<Runtime>,
    /// Listeners kept or added; a listener the shard serves that is not
    /// here stops accepting (its connections finish).
    pub listeners: Vec<ListenerFd>,
    /// The admin socket (shard 0): a fresh descriptor each generation, so
    /// the admin endpoint always reports the current runtime.
    pub admin: Option<RawFd>,
}

/// What the main thread asks of a shard.
pub enum Command {
    Apply(Update),
    /// Stop accepting on every listener and serve what was already accepted
    /// (the listening sockets went to a new process).
    StopAccepting,
    /// Stop accepting, close idle connections after a short grace (see
    /// `process::shard::IDLE_GRACE`), finish within the drain timeout.
    Drain,
}

/// One shard's inbox: commands in order, each acknowledged by its number.
#[derive(Default)]
pub struct Mailbox {
    queue: Mutex<VecDeque<(u64, Command)>>,
    posted: AtomicU64,
    done: AtomicU64,
    notifier: OnceLock<Arc<Notifier>>,
}

impl Mailbox {
    /// Called by the shard once its driver exists.
    pub fn set_notifier(&self, n: Arc<Notifier>) {
        let _ = self.notifier.set(n);
    }

    /// Queues `c` and wakes the shard; returns the number [`Mailbox::wait`] takes.
    pub fn post(&self, c: Command) -> u64 {
        let seq = {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            let seq = self.posted.fetch_add(1, Ordering::AcqRel) + 1;
            q.push_back((seq, c));
            seq
        };
        if let Some(n) = self.notifier.get() {
            n.notify();
        }
        seq
    }

    /// Wakes the shard without a command: a draining shard then looks at
    /// [`crate::process::lifecycle::LIFECYCLE`]'s `cut_now` again.
    pub fn wake(&self) {
        if let Some(n) = self.notifier.get() {
            n.notify();
        }
    }

    /// The shard's side: the next command, if any.
    pub fn take(&self) -> Option<(u64, Command)> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// The shard's side: command `seq` is carried out.
    pub fn ack(&self, seq: u64) {
        self.done.fetch_max(seq, Ordering::AcqRel);
    }

    /// Waits (polling, on the main thread) until command `seq` was carried
    /// out or `until` passes; whether it was.
    pub fn wait(&self, seq: u64, until: Instant) -> bool {
        while self.done.load(Ordering::Acquire) < seq {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}
