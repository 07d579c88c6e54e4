//! `zgix-bench send-zc`'s options and report: the command line, the interleaved rounds, every run's line and the medians per size and mode.

use super::*;
use crate::args::Args;

pub const USAGE: &str = "\
zgix-bench send-zc [--sizes 16K,64K,256K,1M] [--total 4G] [--queue 2] [--rounds 5]
                   [--modes syscall,send,send-zc] [--sender-cpu 0] [--receiver-cpu 1] [--verify]
                   [--max-secs S]

  --sizes LIST       block sizes per send (K, M, G suffixes: powers of 1024)
  --total N          bytes per run (default 4G)
  --queue Q          io_uring sends in flight, one buffer each (default 2)
  --rounds R         rounds; each round runs every size and mode once, interleaved (default 5)
  --modes LIST       syscall (send(2)), send (IORING_OP_SEND), send-zc (IORING_OP_SEND_ZC)
  --sender-cpu N     CPU of the sender thread (default 0)
  --receiver-cpu N   CPU of the receiver thread (default 1)
  --verify           the receiver checks every byte (default: the sequence numbers only)
  --max-secs S       stop a run's sending after S seconds, short of --total (default: no limit)

Loopback TCP (127.0.0.1) only. Prints every run, then per size and mode the
medians over the rounds: MB/s, sender user/sys and receiver user/sys µs per MB
(MB = 10^6 bytes), and for send-zc the share of notifications that said
IORING_NOTIF_USAGE_ZC_COPIED. A send refused by the kernel (ENOMEM, ENOBUFS:
pinned pages over RLIMIT_MEMLOCK) is printed as the run's result.";

/// `send-zc` subcommand options.
pub struct Config {
    sizes: Vec<usize>,
    total: u64,
    queue: usize,
    rounds: usize,
    modes: Vec<Mode>,
    sender_cpu: usize,
    receiver_cpu: usize,
    verify: bool,
    max_secs: Option<f64>,
}

/// Parses `16K`, `1M`, `4G` (powers of 1024) or plain bytes.
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

impl Config {
    pub fn from_args(mut a: Args) -> Result<Self, String> {
        let sizes = match a.value("--sizes")? {
            Some(s) => s
                .split(',')
                .map(|p| parse_size(p).map(|n| n as usize))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![16 << 10, 64 << 10, 256 << 10, 1 << 20],
        };
        if sizes.iter().any(|&b| b > u32::MAX as usize) {
            return Err("--sizes: a block must fit in u32".into());
        }
        let modes = match a.value("--modes")? {
            Some(s) => s
                .split(',')
                .map(Mode::parse)
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![Mode::Syscall, Mode::Send, Mode::SendZc],
        };
        let total = match a.value("--total")? {
            Some(s) => parse_size(&s)?,
            None => 4 << 30,
        };
        let cfg = Config {
            sizes,
            total,
            queue: a.parsed("--queue")?.unwrap_or(2),
            rounds: a.parsed("--rounds")?.unwrap_or(5),
            modes,
            sender_cpu: a.parsed("--sender-cpu")?.unwrap_or(0),
            receiver_cpu: a.parsed("--receiver-cpu")?.unwrap_or(1),
            verify: a.switch("--verify"),
            max_secs: a.parsed("--max-secs")?,
        };
        a.finish()?;
        if cfg.queue == 0 || cfg.queue > 4096 || cfg.rounds == 0 {
            return Err("--queue must be 1..=4096 and --rounds at least 1".into());
        }
        Ok(cfg)
    }
}

fn kib(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

pub(super) fn errno_name(e: i32) -> String {
    let name = match e {
        libc::ENOMEM => "ENOMEM",
        libc::ENOBUFS => "ENOBUFS",
        libc::EINVAL => "EINVAL",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EPIPE => "EPIPE",
        libc::EFAULT => "EFAULT",
        _ => "",
    };
    format!("{name} ({})", io::Error::from_raw_os_error(e))
}

fn line(round: usize, r: &RunResult) -> String {
    let mut s = format!(
        "round {round} {:>7} {:<7} ",
        kib(r.spec.block),
        r.spec.mode.name()
    );
    if let Some(e) = r.sender.errno {
        s += &format!(
            "REFUSED after {} bytes: {}; ",
            r.sender.bytes,
            errno_name(e)
        );
    }
    s += &format!(
        "{} B in {:.3} s = {:.1} MB/s; sender user {:.1} sys {:.1} (sum {:.1}) us/MB; receiver user {:.1} sys {:.1} (sum {:.1}) us/MB; other {:.1} us/MB; sends {} reads {}",
        r.receiver.bytes,
        r.secs,
        r.mb_per_s(),
        r.per_mb(r.sender.cpu.user_us),
        r.per_mb(r.sender.cpu.sys_us),
        r.per_mb(r.sender.cpu.total_us),
        r.per_mb(r.receiver.cpu.user_us),
        r.per_mb(r.receiver.cpu.sys_us),
        r.per_mb(r.receiver.cpu.total_us),
        r.per_mb(r.other.total_us),
        r.sender.sends,
        r.receiver.reads,
    );
    if r.spec.mode == Mode::SendZc {
        s += &format!(
            "; zc more {} notifs {} copied {}",
            r.sender.zc_more, r.sender.zc_notifs, r.sender.zc_copied
        );
    }
    if r.sender.stopped_early {
        s += "; stopped at --max-secs";
    }
    if r.receiver.header_errors + r.receiver.pattern_errors > 0 {
        s += &format!(
            "; ORDER/DATA ERRORS header bytes {} pattern bytes {}",
            r.receiver.header_errors, r.receiver.pattern_errors
        );
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs every size and mode `rounds` times, interleaved, printing each run and the medians.
pub fn run(cfg: Config) -> Result<(), String> {
    let probe_ok = {
        let ring = IoUring::new(8).map_err(|e| format!("io_uring_setup: {e}"))?;
        let mut probe = io_uring::Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| format!("IORING_REGISTER_PROBE: {e}"))?;
        probe.is_supported(opcode::SendZc::CODE)
    };
    let mut memlock: libc::rlimit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut memlock) };
    // SAFETY: uname writes the struct we pass.
    let kernel = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        libc::uname(&mut u);
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    };
    println!(
        "send-zc: kernel {kernel}, IORING_OP_SEND_ZC supported: {probe_ok}, RLIMIT_MEMLOCK {} bytes, euid {}",
        memlock.rlim_cur,
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    );
    println!(
        "send-zc: total {} bytes per run (max {:?} s), queue {}, rounds {}, sender CPU {}, receiver CPU {} (blocking read(2), {} buffer), verify {}",
        cfg.total,
        cfg.max_secs,
        cfg.queue,
        cfg.rounds,
        cfg.sender_cpu,
        cfg.receiver_cpu,
        kib(RECV_BUF),
        cfg.verify
    );
    let mut results: Vec<Vec<Vec<RunResult>>> =
        vec![vec![Vec::new(); cfg.modes.len()]; cfg.sizes.len()];
    for round in 1..=cfg.rounds {
        for (si, &block) in cfg.sizes.iter().enumerate() {
            for (mi, &mode) in cfg.modes.iter().enumerate() {
                let spec = RunSpec {
                    mode,
                    block,
                    total: cfg.total,
                    queue: cfg.queue,
                    sender_cpu: Some(cfg.sender_cpu),
                    receiver_cpu: Some(cfg.receiver_cpu),
                    verify: cfg.verify,
                    max_secs: cfg.max_secs,
                };
                let r =
                    run_once(spec).map_err(|e| format!("{} {}: {e}", kib(block), mode.name()))?;
                println!("{}", line(round, &r));
                results[si][mi].push(r);
            }
        }
    }
    println!();
    println!(
        "medians of {} rounds (µs per MB, MB = 10^6 bytes; copied = share of SEND_ZC notifications with IORING_NOTIF_USAGE_ZC_COPIED):",
        cfg.rounds
    );
    println!("| size | mode | MB/s | sender user | sender sys | sender sum | receiver user | receiver sys | receiver sum | other | copied | runs complete |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (si, &block) in cfg.sizes.iter().enumerate() {
        for (mi, &mode) in cfg.modes.iter().enumerate() {
            let rs = &results[si][mi];
            let m = |f: &dyn Fn(&RunResult) -> f64| median(rs.iter().map(f).collect());
            let copied = if mode == Mode::SendZc {
                let c = m(&|r| r.copied_share().unwrap_or(f64::NAN));
                if c.is_nan() {
                    "n/a".to_string()
                } else {
                    format!("{:.1} %", c * 100.0)
                }
            } else {
                "-".to_string()
            };
            let complete = rs.iter().filter(|r| r.complete()).count();
            println!(
                "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {}/{} |",
                kib(block),
                mode.name(),
                m(&|r| r.mb_per_s()),
                m(&|r| r.per_mb(r.sender.cpu.user_us)),
                m(&|r| r.per_mb(r.sender.cpu.sys_us)),
                m(&|r| r.per_mb(r.sender.cpu.total_us)),
                m(&|r| r.per_mb(r.receiver.cpu.user_us)),
                m(&|r| r.per_mb(r.receiver.cpu.sys_us)),
                m(&|r| r.per_mb(r.receiver.cpu.total_us)),
                m(&|r| r.per_mb(r.other.total_us)),
                copied,
                complete,
                rs.len()
            );
        }
    }
    Ok(())
}
