//! Fleet-scoped rate limits (`"scope": "fleet"`): one sync thread per process sums what every box spent through Redis and debits the local buckets, off the request path.
//!
//! The request path only counts: a fleet-scoped check that takes a token also bumps
//! a counter in the identity's slot (`RateTable::check_fleet`), on the cache line the
//! take already wrote. Every `fleet.sync_ms` the sync thread drains those counters,
//! adds them to this box's total per identity and window, writes the totals to Redis
//! and reads back what every box wrote, and debits the local bucket with what the
//! other boxes spent since the last read. The local table stays authoritative: when
//! Redis is down, slow or refusing, nothing on the request path changes (each box
//! enforces its local limit), and the totals not yet written are kept, bounded, and
//! written when Redis is back.
//!
//! Each box writes its *cumulative* count for a window as one field of a hash
//! (`HSET prefix:listener:identity:window box count`, `PEXPIRE` two windows) and
//! reads the sum of the fields (`HVALS`). Writing a total instead of `INCRBY`-ing a
//! delta makes a resend idempotent: a pipeline whose reply timed out may or may not
//! have been applied, and sending the same total again can never count it twice.

mod resp;
mod sync;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use zgix_admission::{RateParams, RateTable};
use zgix_config::Fleet;

use crate::runtime::Runtime;

/// What the sync thread reads of the current runtime (replaced on reload).
pub(crate) struct View {
    pub fleet: Fleet,
    pub table: Arc<RateTable>,
    /// By fleet tag ([`crate::runtime::fleet_tag`], stable across reloads for a
    /// listener name): name and parameters of the fleet-scoped rate limits of the
    /// current generation. A tag no listener of it has any more is `None`, and
    /// what was counted under it is dropped.
    pub listeners: Vec<Option<(String, RateParams)>>,
}

/// Upper bounds of `zgix_fleet_sync_seconds`, in microseconds.
const SYNC_BUCKETS_US: [u64; 8] = [500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000];

/// `zgix_fleet_sync_total` results.
pub(crate) const RESULTS: [&str; 3] = ["ok", "error", "timeout"];

/// The process's sync state: the view and the counters `/metrics` renders.
pub(crate) struct Shared {
    view: Mutex<Option<Arc<View>>>,
    pub results: [AtomicU64; 3],
    /// Non-cumulative bucket counts; the last counts exchanges above 100 ms.
    pub seconds: [AtomicU64; SYNC_BUCKETS_US.len() + 1],
    pub seconds_sum_us: AtomicU64,
    pub pending: AtomicI64,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

fn shared() -> &'static Shared {
    SHARED.get_or_init(|| Shared {
        view: Mutex::new(None),
        results: Default::default(),
        seconds: Default::default(),
        seconds_sum_us: AtomicU64::new(0),
        pending: AtomicI64::new(0),
    })
}

impl Shared {
    pub(crate) fn view(&self) -> Option<Arc<View>> {
        self.view.lock().ok().and_then(|v| v.clone())
    }

    pub(crate) fn record(&self, result: usize, us: u64) {
        self.results[result].fetch_add(1, Ordering::Relaxed);
        let i = SYNC_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(SYNC_BUCKETS_US.len());
        self.seconds[i].fetch_add(1, Ordering::Relaxed);
        self.seconds_sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

/// Hands the sync thread the runtime just built (at start and after each reload),
/// starting the thread the first time a config has a `fleet` section. A runtime
/// without one leaves the thread idle.
pub fn attach(rt: &Runtime) {
    let s = shared();
    let view = rt.config.fleet.as_ref().map(|f| {
        Arc::new(View {
            fleet: f.clone(),
            table: rt.rate_table.clone(),
            listeners: by_tag(rt),
        })
    });
    let start = view.is_some();
    if let Ok(mut v) = s.view.lock() {
        *v = view;
    }
    static STARTED: OnceLock<()> = OnceLock::new();
    if start && STARTED.set(()).is_ok() {
        if let Err(e) = std::thread::Builder::new()
            .name("zgix-fleet".into())
            .spawn(|| sync::run(shared()))
        {
            crate::log_error!("fleet", "cannot start the fleet sync thread: {e}");
        }
    }
}

/// The current generation's fleet-scoped listeners, indexed by their tag.
fn by_tag(rt: &Runtime) -> Vec<Option<(String, RateParams)>> {
    let mut v: Vec<Option<(String, RateParams)>> = Vec::new();
    for l in &rt.listeners {
        if let (Some(p), Some(tag)) = (l.rate_limit, l.rate.fleet) {
            let i = tag as usize;
            if v.len() <= i {
                v.resize(i + 1, None);
            }
            v[i] = Some((l.name.clone(), p));
        }
    }
    v
}

/// The fleet series, when a config ever had a `fleet` section.
pub fn render(out: &mut String) {
    use std::fmt::Write as _;
    let Some(s) = SHARED.get() else { return };
    if s.view().is_none() && s.results.iter().all(|r| r.load(Ordering::Relaxed) == 0) {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP zgix_fleet_sync_total Exchanges of the fleet sync with Redis, by result.\n# TYPE zgix_fleet_sync_total counter"
    );
    for (i, r) in RESULTS.iter().enumerate() {
        let _ = writeln!(
            out,
            "zgix_fleet_sync_total{{result=\"{r}\"}} {}",
            s.results[i].load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP zgix_fleet_sync_seconds Duration of one exchange with Redis (failed ones included).\n# TYPE zgix_fleet_sync_seconds histogram"
    );
    let mut cum = 0;
    for (i, b) in SYNC_BUCKETS_US.iter().enumerate() {
        cum += s.seconds[i].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "zgix_fleet_sync_seconds_bucket{{le=\"{}\"}} {cum}",
            *b as f64 / 1e6
        );
    }
    cum += s.seconds[SYNC_BUCKETS_US.len()].load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "zgix_fleet_sync_seconds_bucket{{le=\"+Inf\"}} {cum}\nzgix_fleet_sync_seconds_sum {}\nzgix_fleet_sync_seconds_count {cum}",
        s.seconds_sum_us.load(Ordering::Relaxed) as f64 / 1e6
    );
    let _ = writeln!(
        out,
        "# HELP zgix_fleet_pending_deltas Identity-windows whose count this box has not yet written to Redis.\n# TYPE zgix_fleet_pending_deltas gauge\nzgix_fleet_pending_deltas {}",
        s.pending.load(Ordering::Relaxed)
    );
}
