//! The sync thread's loop: drain what this box spent, write each identity-window's total to Redis, read the fleet's, debit the local buckets.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use zgix_admission::ClientId;

use super::resp::{self, Reply};
use super::{Shared, View};

/// Most identity-windows kept at once. Past it the oldest windows are dropped (and
/// counted in the state-change log line): a box that cannot reach Redis for a long
/// time forgets old windows instead of growing without bound.
const MAX_TRACKS: usize = 65_536;

/// One identity's spending in one window, as this box knows it.
#[derive(Default)]
struct Track {
    /// What this box spent (cumulative).
    own: u64,
    /// `own` as last acknowledged by Redis.
    sent: u64,
    /// What the other boxes had spent at the last read.
    others: u64,
}

type Key = (u32, ClientId, u64);

struct State {
    box_id: String,
    tracks: HashMap<Key, Track>,
    /// What other boxes spent since the last read, per listener and identity
    /// (summed over windows), debited once the replies are in.
    debt: HashMap<(u32, ClientId), u64>,
    conn: Option<resp::Conn>,
    /// `None` before the first exchange, then whether the last one succeeded.
    up: Option<bool>,
    /// Until when reads after an outage only set the baseline.
    recovering_until: Option<Instant>,
    dropped: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The thread's body: never returns.
pub(super) fn run(shared: &'static Shared) {
    let nonce = std::collections::hash_map::RandomState::new();
    let box_id = format!(
        "{}-{:016x}",
        std::process::id(),
        std::hash::BuildHasher::hash_one(&nonce, unix_ms())
    );
    let mut st = State {
        box_id,
        tracks: HashMap::new(),
        debt: HashMap::new(),
        conn: None,
        up: None,
        recovering_until: None,
        dropped: 0,
    };
    let mut next = Instant::now();
    // The table of the last view: after a reload that removed the `fleet` section
    // its counts are still drained (and dropped), since a slot with an undrained
    // count is never recycled (`RateTable::drain_spent`).
    let mut last_table: Option<std::sync::Arc<zgix_admission::RateTable>> = None;
    loop {
        let Some(period) = shared.view().map(|v| v.fleet.sync_ms) else {
            if let Some(t) = &last_table {
                t.drain_spent(|_, _, _| {});
            }
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        next += Duration::from_millis(period);
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
        // The view as it is now, not as it was before the sleep: a reload during
        // the sleep must not have its first exchange made with the old listeners.
        if let Some(view) = shared.view() {
            tick(shared, &view, &mut st);
            last_table = Some(view.table.clone());
        }
    }
}

fn tick(shared: &Shared, view: &View, st: &mut State) {
    collect(view, st);
    // (Every kept track's listener is fleet-scoped: `collect` dropped the others,
    // so each key below gets its three commands and the reply count matches.)
    let keys: Vec<Key> = st.tracks.keys().copied().collect();
    let pending = st.tracks.values().filter(|t| t.own > t.sent).count();
    shared.pending.store(pending as i64, Ordering::Relaxed);
    if keys.is_empty() {
        return;
    }
    let pipeline = pipeline(view, st, &keys);
    let timeout = Duration::from_millis(view.fleet.timeout_ms.max(1));
    let t0 = Instant::now();
    let deadline = t0 + timeout;
    let sent: Vec<u64> = keys.iter().map(|k| st.tracks[k].own).collect();
    let result = (|| {
        if st.conn.is_none() {
            st.conn = Some(resp::Conn::connect(&view.fleet.redis, timeout)?);
        }
        let conn = st.conn.as_mut().expect("just connected");
        conn.exchange(&pipeline, keys.len() * 3, deadline)
    })();
    let us = t0.elapsed().as_micros() as u64;
    match result {
        Ok(replies) => on_replies(shared, view, st, &keys, &sent, &replies, us),
        Err(e) => on_failure(shared, view, st, &e, us, pending),
    }
}

/// Drains what this box spent into the tracks and forgets the windows that
/// closed (and, past [`MAX_TRACKS`], the oldest).
fn collect(view: &View, st: &mut State) {
    let now_ms = unix_ms();
    let window = |tag: u32| {
        view.listeners
            .get(tag as usize)
            .and_then(|l| l.as_ref())
            .map(|(_, p)| now_ms / p.window_ms.max(1))
    };
    view.table.drain_spent(|id, tag, n| {
        if let Some(w) = window(tag) {
            st.tracks.entry((tag, id, w)).or_default().own += n;
        }
    });
    // Windows still open: the current one and the one before (a count drained
    // just after a window turned). Older ones are forgotten.
    st.tracks.retain(|&(tag, _, w), t| {
        let keep = window(tag).is_some_and(|cur| w + 1 >= cur);
        if !keep && t.own > t.sent {
            st.dropped += 1;
        }
        keep
    });
    if st.tracks.len() > MAX_TRACKS {
        let mut ws: Vec<u64> = st.tracks.keys().map(|k| k.2).collect();
        ws.sort_unstable();
        let cut = ws[st.tracks.len() - MAX_TRACKS];
        let before = st.tracks.len();
        st.tracks.retain(|k, _| k.2 > cut);
        st.dropped += (before - st.tracks.len()) as u64;
    }
}

/// The pipeline of one sync: per identity-window, this box's total (`HSET`),
/// the key's expiry (`PEXPIRE`, two windows) and the fleet's totals (`HVALS`).
fn pipeline(view: &View, st: &State, keys: &[Key]) -> Vec<u8> {
    let mut pipeline = Vec::with_capacity(keys.len() * 128);
    let mut name = String::new();
    for k in keys {
        let (tag, id, w) = *k;
        let (lname, p) = view.listeners[tag as usize]
            .as_ref()
            .expect("retained tracks are fleet-scoped");
        name.clear();
        let _ = write!(
            name,
            "{}:{lname}:{:032x}:{w}",
            view.fleet.prefix,
            id.to_bits()
        );
        let own = st.tracks[k].own.to_string();
        let ttl = (p.window_ms.max(1) * 2).to_string();
        resp::command(
            &mut pipeline,
            &[
                b"HSET",
                name.as_bytes(),
                st.box_id.as_bytes(),
                own.as_bytes(),
            ],
        );
        resp::command(
            &mut pipeline,
            &[b"PEXPIRE", name.as_bytes(), ttl.as_bytes()],
        );
        resp::command(&mut pipeline, &[b"HVALS", name.as_bytes()]);
    }
    pipeline
}

/// A sync Redis answered: what the other boxes spent since the last read is
/// debited from the local buckets (unless Redis has just come back).
fn on_replies(
    shared: &Shared,
    view: &View,
    st: &mut State,
    keys: &[Key],
    sent: &[u64],
    replies: &[Reply],
    us: u64,
) {
    shared.record(0, us);
    // What the other boxes spent while Redis was away was spent against
    // their own local limits, and this box's bucket refilled meanwhile as if
    // apart: debiting it when the totals reappear would refuse the client
    // for traffic the fleet already allowed. For three periods after Redis
    // is back (every box that is up rewrites its totals each period) the
    // reads only set the baseline; debits resume after.
    if st.up == Some(false) {
        st.recovering_until =
            Some(Instant::now() + Duration::from_millis(view.fleet.sync_ms.saturating_mul(3)));
    }
    let apply = st.recovering_until.is_none_or(|t| Instant::now() >= t);
    for (i, k) in keys.iter().enumerate() {
        let Some(Reply::Array(vals)) = replies.get(i * 3 + 2) else {
            continue;
        };
        let total: u64 = vals
            .iter()
            .filter_map(|v| match v {
                Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse::<u64>().ok(),
                _ => None,
            })
            .sum();
        let t = st.tracks.get_mut(k).expect("kept");
        t.sent = t.sent.max(sent[i]);
        let others = total.saturating_sub(sent[i]);
        let new = others.saturating_sub(t.others);
        t.others = t.others.max(others);
        let (tag, id, _) = *k;
        if apply {
            *st.debt.entry((tag, id)).or_default() += new;
        }
    }
    // Debit at once: past what the bucket holds, `debit` moves the bucket's
    // clock forward (at most one full refill), so nothing is carried.
    let now_ns = zgix_admission::monotonic_now_ns();
    for ((tag, id), owed) in st.debt.drain() {
        if let Some((_, p)) = view.listeners.get(tag as usize).and_then(|l| l.as_ref()) {
            view.table.debit(id, *p, owed, now_ns);
        }
    }
    let pending = st.tracks.values().filter(|t| t.own > t.sent).count();
    shared.pending.store(pending as i64, Ordering::Relaxed);
    if st.up != Some(true) {
        if st.up.is_none() {
            crate::log_info!(
                "fleet",
                "fleet: syncing with redis {} every {} ms as box {}",
                view.fleet.redis,
                view.fleet.sync_ms,
                st.box_id
            );
        } else {
            crate::log_info!(
                "fleet",
                "fleet: redis {} reachable again: pending counts written, fleet limits apply ({} identity-windows dropped while it was away)",
                view.fleet.redis,
                st.dropped
            );
        }
        st.up = Some(true);
        st.dropped = 0;
    }
}

/// A sync that failed: the counts stay pending; one log line per state change.
fn on_failure(
    shared: &Shared,
    view: &View,
    st: &mut State,
    e: &std::io::Error,
    us: u64,
    pending: usize,
) {
    st.conn = None;
    let timeout = matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    );
    shared.record(if timeout { 2 } else { 1 }, us);
    if st.up != Some(false) {
        crate::log_warn!(
            "fleet",
            "fleet: redis {} unreachable ({e}): each box enforces its local limit; {pending} pending counts kept",
            view.fleet.redis
        );
        st.up = Some(false);
    }
}
