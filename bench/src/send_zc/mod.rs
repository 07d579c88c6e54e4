//! `zgix-bench send-zc`: io_uring `SEND_ZC` against `SEND` and plain `send(2)` on a loopback TCP pair (issue 21), with CPU per MB of both ends.
//!
//! One run: a connected 127.0.0.1 TCP pair; the sender thread (pinned, by
//! default to CPU 0) sends blocks of B bytes until T bytes have gone, the
//! receiver thread (pinned, by default to CPU 1) reads them with a plain
//! blocking `read(2)` loop into a 1 MiB buffer until EOF. Each block starts
//! with its sequence number (8 bytes, little-endian) and the rest is a fixed
//! pattern; the receiver always checks the sequence numbers (so reordered or
//! interleaved sends show as errors) and, with `verify`, every byte.
//!
//! Modes: `syscall` is a blocking `send(2)` loop from one buffer; `send` and
//! `send-zc` keep Q sends in flight on an io_uring ring of the sender's own,
//! one buffer of a pool of Q per send, with `MSG_WAITALL` so that a send
//! completes whole (the kernel retries a short one itself), the Q sends
//! linked (`IOSQE_IO_LINK`) so that their bytes cannot interleave. A `SEND_ZC`
//! buffer is reused only after both its completion and, when that has
//! `IORING_CQE_F_MORE`, its notification (`IORING_CQE_F_NOTIF`); sends ask
//! for `IORING_SEND_ZC_REPORT_USAGE`, so each notification says whether the
//! kernel copied the bytes after all (`IORING_NOTIF_USAGE_ZC_COPIED`).
//!
//! CPU time is `getrusage(RUSAGE_THREAD)` of each thread around its loop
//! (user and system apart, tick-sampled) and, exact, the thread's CPU clock;
//! "other" is the process's CPU clock minus the two threads' (io-wq workers,
//! had there been any). Loopback's receive softirq runs on the sending CPU,
//! inside the sender's time; softirq work done in ksoftirqd is counted
//! nowhere. MB is 10^6 bytes.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Barrier};
use std::time::Instant;

mod report;

pub use report::{run, Config, USAGE};

/// `IORING_SEND_ZC_REPORT_USAGE` (io_uring.h): the notification's `res` says whether the kernel copied.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED` (io_uring.h): set in a notification's `res` when the bytes were copied.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
/// Bytes of the sequence number at the start of each block.
const HEADER: usize = 8;
/// The receiver's read buffer.
const RECV_BUF: usize = 1 << 20;

/// How the sender sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// A blocking `send(2)` loop.
    Syscall,
    /// `IORING_OP_SEND`, Q in flight.
    Send,
    /// `IORING_OP_SEND_ZC`, Q in flight, each buffer held until its notification.
    SendZc,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Syscall => "syscall",
            Mode::Send => "send",
            Mode::SendZc => "send-zc",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s {
            "syscall" => Ok(Mode::Syscall),
            "send" => Ok(Mode::Send),
            "send-zc" | "sendzc" | "zc" => Ok(Mode::SendZc),
            _ => Err(format!("unknown mode {s:?} (syscall, send, send-zc)")),
        }
    }
}

/// One run's parameters.
#[derive(Clone, Copy, Debug)]
pub struct RunSpec {
    pub mode: Mode,
    pub block: usize,
    pub total: u64,
    pub queue: usize,
    pub sender_cpu: Option<usize>,
    pub receiver_cpu: Option<usize>,
    pub verify: bool,
    /// Stop queueing sends after this long (the run then counts what was sent).
    pub max_secs: Option<f64>,
}

/// CPU time of one thread (or the process) in µs: user and system from
/// `getrusage` (tick-sampled, 250 Hz here, split in proportion), their sum
/// exact from `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` (or the process clock).
#[derive(Clone, Copy, Default, Debug)]
pub struct Cpu {
    pub user_us: f64,
    pub sys_us: f64,
    pub total_us: f64,
}

impl Cpu {
    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            user_us: self.user_us - before.user_us,
            sys_us: self.sys_us - before.sys_us,
            total_us: self.total_us - before.total_us,
        }
    }
}

fn rusage(who: libc::c_int) -> Cpu {
    // SAFETY: getrusage writes a plain struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD and RUSAGE_SELF are valid `who`s.
    unsafe { libc::getrusage(who, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    let clock = if who == libc::RUSAGE_THREAD {
        libc::CLOCK_THREAD_CPUTIME_ID
    } else {
        libc::CLOCK_PROCESS_CPUTIME_ID
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the struct we pass.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    Cpu {
        user_us: us(ru.ru_utime),
        sys_us: us(ru.ru_stime),
        total_us: ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3,
    }
}

/// What the sender saw.
#[derive(Clone, Copy, Default, Debug)]
pub struct SendStats {
    pub bytes: u64,
    pub sends: u64,
    /// `SEND_ZC` completions with `IORING_CQE_F_MORE` (a notification followed).
    pub zc_more: u64,
    pub zc_notifs: u64,
    pub zc_copied: u64,
    /// The first failed send's errno, if any (the run stops there).
    pub errno: Option<i32>,
    pub cpu: Cpu,
    pub start: Option<Instant>,
    /// The deadline (`max_secs`) stopped the run before `total` bytes.
    pub stopped_early: bool,
}

/// True once `spec.max_secs` has passed since `start` (and records it).
fn past_deadline(spec: &RunSpec, st: &mut SendStats) -> bool {
    if let (Some(max), Some(start)) = (spec.max_secs, st.start) {
        if start.elapsed().as_secs_f64() >= max {
            st.stopped_early = true;
        }
    }
    st.stopped_early
}

/// What the receiver saw.
#[derive(Clone, Copy, Default, Debug)]
pub struct RecvStats {
    pub bytes: u64,
    pub reads: u64,
    /// Sequence-number bytes that were not the block's number.
    pub header_errors: u64,
    /// Payload bytes off the pattern (only counted with `verify`).
    pub pattern_errors: u64,
    pub cpu: Cpu,
    pub end: Option<Instant>,
}

/// One run's outcome.
#[derive(Clone, Copy, Debug)]
pub struct RunResult {
    pub spec: RunSpec,
    pub sender: SendStats,
    pub receiver: RecvStats,
    /// Process CPU beyond the two threads.
    pub other: Cpu,
    pub secs: f64,
}

impl RunResult {
    fn mb(&self) -> f64 {
        self.receiver.bytes as f64 / 1e6
    }
    pub fn mb_per_s(&self) -> f64 {
        self.mb() / self.secs
    }
    fn per_mb(&self, us: f64) -> f64 {
        us / self.mb()
    }
    pub fn copied_share(&self) -> Option<f64> {
        (self.sender.zc_notifs > 0)
            .then(|| self.sender.zc_copied as f64 / self.sender.zc_notifs as f64)
    }
    /// True if every byte arrived and in order.
    pub fn complete(&self) -> bool {
        self.sender.errno.is_none()
            && self.receiver.bytes == self.sender.bytes
            && (self.sender.bytes == self.spec.total || self.sender.stopped_early)
            && self.receiver.header_errors == 0
            && self.receiver.pattern_errors == 0
    }
}

/// The pattern byte at offset `j` of a block (past the sequence number).
fn pattern(j: usize) -> u8 {
    (j % 251) as u8
}

fn fill(buf: &mut [u8]) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = pattern(j);
    }
}

fn put_seq(buf: &mut [u8], seq: u64) {
    let n = HEADER.min(buf.len());
    buf[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
}

fn pin(cpu: Option<usize>) -> io::Result<()> {
    let Some(cpu) = cpu else { return Ok(()) };
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity only touch it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::other(format!(
                "sched_setaffinity to CPU {cpu}: {}",
                io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Runs one transfer of `spec.total` bytes and returns both ends' counts.
pub fn run_once(spec: RunSpec) -> io::Result<RunResult> {
    assert!(spec.block >= 1 && spec.queue >= 1);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let tx = TcpStream::connect(listener.local_addr()?)?;
    let (rx, _) = listener.accept()?;
    drop(listener);
    tx.set_nodelay(true)?;
    let barrier = Arc::new(Barrier::new(3));

    let b = barrier.clone();
    let receiver = std::thread::Builder::new()
        .name("send-zc-rx".into())
        .spawn(move || -> io::Result<RecvStats> {
            pin(spec.receiver_cpu)?;
            b.wait();
            receive(rx, spec)
        })?;
    let b = barrier.clone();
    let sender = std::thread::Builder::new()
        .name("send-zc-tx".into())
        .spawn(move || -> io::Result<SendStats> {
            pin(spec.sender_cpu)?;
            b.wait();
            let r = send(&tx, spec);
            drop(tx); // EOF for the receiver, also after an error
            r
        })?;
    let self_before = rusage(libc::RUSAGE_SELF);
    barrier.wait();
    let sent = sender
        .join()
        .map_err(|_| io::Error::other("sender panicked"))?;
    let received = receiver
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))?;
    let self_cpu = rusage(libc::RUSAGE_SELF).since(self_before);
    let (sender, receiver) = (sent?, received?);
    let secs = match (sender.start, receiver.end) {
        (Some(s), Some(e)) => e.duration_since(s).as_secs_f64(),
        _ => f64::NAN,
    };
    // Only the exact sums subtract meaningfully.
    let other = Cpu {
        user_us: f64::NAN,
        sys_us: f64::NAN,
        total_us: self_cpu.total_us - sender.cpu.total_us - receiver.cpu.total_us,
    };
    Ok(RunResult {
        spec,
        sender,
        receiver,
        other,
        secs,
    })
}

fn receive(rx: TcpStream, spec: RunSpec) -> io::Result<RecvStats> {
    let mut buf = vec![0u8; RECV_BUF];
    let mut st = RecvStats::default();
    let block = spec.block as u64;
    let before = rusage(libc::RUSAGE_THREAD);
    let fd = rx.as_raw_fd();
    loop {
        // SAFETY: reads into a buffer we own, within its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        st.reads += 1;
        let off = st.bytes;
        let chunk = &buf[..n];
        // The sequence-number bytes of every block this read overlaps.
        let mut blk = off / block;
        while blk * block < off + n as u64 {
            let start = blk * block;
            let seq = blk.to_le_bytes();
            let hdr_end = start + (HEADER as u64).min(block);
            let lo = start.max(off);
            let hi = hdr_end.min(off + n as u64);
            for k in lo..hi {
                if chunk[(k - off) as usize] != seq[(k - start) as usize] {
                    st.header_errors += 1;
                }
            }
            blk += 1;
        }
        if spec.verify {
            for (i, &b) in chunk.iter().enumerate() {
                let j = ((off + i as u64) % block) as usize;
                if j >= HEADER && b != pattern(j) {
                    st.pattern_errors += 1;
                }
            }
        }
        st.bytes += n as u64;
    }
    st.end = Some(Instant::now());
    st.cpu = rusage(libc::RUSAGE_THREAD).since(before);
    Ok(st)
}

fn send(tx: &TcpStream, spec: RunSpec) -> io::Result<SendStats> {
    match spec.mode {
        Mode::Syscall => send_syscall(tx, spec),
        Mode::Send | Mode::SendZc => send_ring(tx, spec),
    }
}

fn send_syscall(tx: &TcpStream, spec: RunSpec) -> io::Result<SendStats> {
    let mut buf = vec![0u8; spec.block];
    fill(&mut buf);
    let fd = tx.as_raw_fd();
    let mut st = SendStats::default();
    let before = rusage(libc::RUSAGE_THREAD);
    st.start = Some(Instant::now());
    let mut seq = 0u64;
    'blocks: while st.bytes < spec.total && !past_deadline(&spec, &mut st) {
        let len = (spec.total - st.bytes).min(spec.block as u64) as usize;
        put_seq(&mut buf, seq);
        seq += 1;
        let mut done = 0;
        while done < len {
            // SAFETY: sends from a buffer we own, within its length.
            let n = unsafe { libc::send(fd, buf[done..len].as_ptr().cast(), len - done, 0) };
            st.sends += 1;
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                st.errno = e.raw_os_error();
                break 'blocks;
            }
            done += n as usize;
            st.bytes += n as u64;
        }
    }
    st.cpu = rusage(libc::RUSAGE_THREAD).since(before);
    Ok(st)
}

/// One buffer of the ring's pool and what is still owed on it.
struct Slot {
    buf: Vec<u8>,
    len: usize,
    /// The send's completion has not come yet.
    send_pending: bool,
    /// A `SEND_ZC` notification has not come yet.
    notif_pending: bool,
}

fn send_ring(tx: &TcpStream, spec: RunSpec) -> io::Result<SendStats> {
    let zc = spec.mode == Mode::SendZc;
    let entries = (2 * spec.queue).next_power_of_two().max(8) as u32;
    let mut ring = IoUring::new(entries)?;
    let fd = types::Fd(tx.as_raw_fd());
    let mut slots: Vec<Slot> = (0..spec.queue)
        .map(|_| {
            let mut buf = vec![0u8; spec.block];
            fill(&mut buf);
            Slot {
                buf,
                len: 0,
                send_pending: false,
                notif_pending: false,
            }
        })
        .collect();
    let mut st = SendStats::default();
    let before = rusage(libc::RUSAGE_THREAD);
    st.start = Some(Instant::now());
    let mut queued: u64 = 0; // bytes handed to the ring
    let mut seq = 0u64;
    let mut busy = 0usize;
    let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(entries as usize * 2);
    let mut chain_sqes = Vec::with_capacity(spec.queue);
    let mut free: Vec<usize> = (0..spec.queue).collect();
    let mut sends_pending = 0usize;
    loop {
        // Sends of one TCP socket in flight at once may interleave their bytes (a
        // short send waits for space, the other gets in), so up to Q sends go as one
        // linked chain (IOSQE_IO_LINK), and the next chain once the last has completed.
        let mut chain = 0usize;
        while sends_pending == 0
            && st.errno.is_none()
            && queued < spec.total
            && (chain > 0 || !past_deadline(&spec, &mut st))
        {
            let Some(i) = free.pop() else { break };
            let s = &mut slots[i];
            s.len = (spec.total - queued).min(spec.block as u64) as usize;
            put_seq(&mut s.buf, seq);
            seq += 1;
            queued += s.len as u64;
            s.send_pending = true;
            let ptr = s.buf.as_ptr();
            let sqe = if zc {
                opcode::SendZc::new(fd, ptr, s.len as u32)
                    .flags(libc::MSG_WAITALL)
                    .zc_flags(SEND_ZC_REPORT_USAGE)
                    .build()
            } else {
                opcode::Send::new(fd, ptr, s.len as u32)
                    .flags(libc::MSG_WAITALL)
                    .build()
            };
            chain_sqes.push(sqe.user_data(i as u64));
            busy += 1;
            st.sends += 1;
            chain += 1;
            if chain == spec.queue {
                break;
            }
        }
        if !chain_sqes.is_empty() {
            let last = chain_sqes.len() - 1;
            for (k, sqe) in chain_sqes.drain(..).enumerate() {
                let sqe = if k < last {
                    sqe.flags(squeue::Flags::IO_LINK)
                } else {
                    sqe
                };
                // SAFETY: the buffer lives in `slots` until its completion (and notification) is reaped below.
                unsafe { ring.submission().push(&sqe) }
                    .map_err(|_| io::Error::other("submission queue full"))?;
            }
            sends_pending += chain;
        }
        if busy == 0 {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        cqes.clear();
        cqes.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(ud, res, flags) in &cqes {
            let i = ud as usize;
            let s = &mut slots[i];
            if cqueue::notif(flags) {
                st.zc_notifs += 1;
                if (res as u32) & NOTIF_USAGE_ZC_COPIED != 0 {
                    st.zc_copied += 1;
                }
                s.notif_pending = false;
            } else {
                s.send_pending = false;
                sends_pending -= 1;
                if cqueue::more(flags) {
                    st.zc_more += 1;
                    s.notif_pending = true;
                }
                if res < 0 {
                    st.errno.get_or_insert(-res);
                } else {
                    st.bytes += res as u64;
                    if res as usize != s.len && st.errno.is_none() {
                        // MSG_WAITALL: a short send means the socket failed; stop.
                        st.errno = Some(libc::EPIPE);
                    }
                }
            }
            if !s.send_pending && !s.notif_pending {
                busy -= 1;
                free.push(i);
            }
        }
    }
    st.cpu = rusage(libc::RUSAGE_THREAD).since(before);
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::report::{errno_name, parse_size};
    use super::*;

    fn spec(mode: Mode, block: usize, queue: usize) -> RunSpec {
        RunSpec {
            mode,
            block,
            total: 1 << 20,
            queue,
            sender_cpu: None,
            receiver_cpu: None,
            verify: true,
            max_secs: None,
        }
    }

    /// 1 MiB through each mode arrives whole, in order and byte for byte.
    #[test]
    fn each_mode_delivers_the_bytes() {
        for mode in [Mode::Syscall, Mode::Send, Mode::SendZc] {
            // 100,000 does not divide 1 MiB: a short last block.
            for (block, queue) in [(16 << 10, 2), (64 << 10, 4), (1 << 20, 2), (100_000, 3)] {
                let r = run_once(spec(mode, block, queue)).expect("run");
                if mode == Mode::SendZc {
                    if let Some(e) = r.sender.errno {
                        // The kernel may refuse to pin the pages (RLIMIT_MEMLOCK): the documented errors.
                        assert!(
                            e == libc::ENOMEM || e == libc::ENOBUFS,
                            "SEND_ZC refused with {}, not ENOMEM/ENOBUFS",
                            errno_name(e)
                        );
                        continue;
                    }
                    // Every completion that promised a notification got one.
                    assert_eq!(r.sender.zc_more, r.sender.zc_notifs, "{r:?}");
                    assert!(r.sender.zc_notifs > 0, "{r:?}");
                }
                assert_eq!(r.sender.errno, None, "{mode:?} {block}: {r:?}");
                assert_eq!(r.sender.bytes, 1 << 20, "{mode:?} {block}");
                assert_eq!(r.receiver.bytes, 1 << 20, "{mode:?} {block}");
                assert_eq!(r.receiver.header_errors, 0, "{mode:?} {block}");
                assert_eq!(r.receiver.pattern_errors, 0, "{mode:?} {block}");
                assert!(r.complete());
            }
        }
    }

    /// A deadline stops the run short of the total with what was sent all received.
    #[test]
    fn the_deadline_stops_a_run_cleanly() {
        for mode in [Mode::Syscall, Mode::Send, Mode::SendZc] {
            let mut s = spec(mode, 64 << 10, 2);
            s.total = 1 << 40;
            s.max_secs = Some(0.05);
            s.verify = false;
            let r = run_once(s).expect("run");
            if mode == Mode::SendZc && matches!(r.sender.errno, Some(libc::ENOMEM | libc::ENOBUFS))
            {
                continue;
            }
            assert!(r.sender.stopped_early, "{r:?}");
            assert!(r.complete(), "{r:?}");
            assert!(r.receiver.bytes > 0 && r.receiver.bytes < 1 << 40);
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("16K").unwrap(), 16384);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn receiver_sees_a_wrong_sequence_number() {
        // Two blocks of 16 bytes with the second's number wrong: the check must notice.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (rx, _) = listener.accept().unwrap();
        let mut data = vec![0u8; 32];
        fill(&mut data[..16]);
        fill(&mut data[16..]);
        put_seq(&mut data[..16], 0);
        put_seq(&mut data[16..], 5);
        std::io::Write::write_all(&mut tx, &data).unwrap();
        drop(tx);
        let mut s = spec(Mode::Syscall, 16, 1);
        s.total = 32;
        let st = receive(rx, s).unwrap();
        assert_eq!(st.bytes, 32);
        assert!(st.header_errors > 0);
        assert_eq!(st.pattern_errors, 0);
    }
}
