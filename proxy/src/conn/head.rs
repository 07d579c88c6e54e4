//! Reading a request head: the PROXY header, then bytes until a whole head is buffered, scanning each byte once and enforcing 414/431 by length as bytes arrive.

use std::io;
use std::time::Instant;

use futures_lite::future::or;
use zgix_admission::ClientId;
use zgix_parser::proxy_protocol::{parse_proxy_header, ProxyStatus};
use zgix_parser::{ParseError, Status};

use super::state::{Held, State};
use super::{client_ip, is_timeout, shard, Conn};
use crate::observe::metrics::ConnRefusal;

/// How a head read ended.
pub(super) enum HeadRead {
    /// A whole head is parsed, in this exchange.
    Ready(Held),
    /// The connection ends without an answer: EOF or an error inside a
    /// head, nothing of the first head in time, no request state.
    Closed,
    /// The head did not come in time; the exchange its first bytes are in
    /// (answered 408 if there are some).
    TimedOut(Held),
    Bad(ParseError, Held),
}

/// Where the end of a head may be, found by scanning each new byte once.
///
/// A head ends at an empty line (RFC 9112 §2.1). The scanner looks at each
/// line feed once and reports a *candidate* end when the next line is empty
/// (`\n\n`, or `\n\r\n`, so that a bare-LF head still reaches the strict
/// parser and its 400). The parser then runs once over the whole head. The
/// request line's and the head's length limits are checked here, by length,
/// so a client that never ends its line or head is answered 414 or 431 as
/// soon as it passes the limit, not at the buffer's end.
#[derive(Default, Debug)]
pub struct HeadScan {
    /// Bytes of the head already examined.
    pos: usize,
    /// The request line has ended (its first non-empty line).
    line_done: bool,
    /// Bytes looked at over this scanner's life (the linearity test reads it).
    pub examined: u64,
}

/// What a scan found.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// No end yet: read more.
    More,
    /// The head may end here: run the parser.
    Candidate,
    Refuse(ParseError),
}

impl HeadScan {
    /// Scans what `head` holds beyond what was already examined.
    pub fn feed(&mut self, head: &[u8], max_line: usize, max_head: usize) -> Scan {
        let mut i = self.pos;
        let mut found = false;
        while i < head.len() {
            let Some(off) = memchr::memchr(b'\n', &head[i..]) else {
                self.examined += (head.len() - i) as u64;
                i = head.len();
                break;
            };
            let nl = i + off;
            self.examined += (off + 1) as u64;
            if !self.line_done {
                let line = &head[..nl];
                let empty = line.iter().all(|&b| b == b'\r' || b == b'\n');
                if !empty {
                    self.line_done = true;
                }
            }
            match (head.get(nl + 1), head.get(nl + 2)) {
                (Some(b'\n'), _) | (Some(b'\r'), Some(b'\n')) => {
                    self.examined += 2;
                    self.pos = nl + 1;
                    found = true;
                    break;
                }
                (None, _) | (Some(b'\r'), None) => {
                    // Undecided until the next bytes: look at this LF again.
                    self.pos = nl;
                    i = nl;
                    break;
                }
                _ => i = nl + 1,
            }
        }
        if !found && i >= head.len() {
            self.pos = head.len();
        }
        if found && self.line_done {
            return Scan::Candidate;
        }
        if !self.line_done && head.len() > max_line + 2 {
            return Scan::Refuse(ParseError::UriTooLong);
        }
        if head.len() > max_head {
            return Scan::Refuse(ParseError::HeadersTooLarge);
        }
        if found {
            // Only empty lines so far (allowed before a request line).
            return Scan::More;
        }
        Scan::More
    }
}

impl Conn {
    /// Reads the PROXY protocol header (v1 or v2) within its deadline and makes
    /// its source the client identity. LOCAL/UNKNOWN keep the peer address.
    /// Returns the exchange holding the bytes after the header.
    /// `Err(None)`: no request state could be made (answered 503).
    pub(super) async fn read_proxy_header(&mut self) -> Result<Held, Option<ConnRefusal>> {
        let shard = self.shard.clone();
        let deadline = shard.driver.now() + shard.rt.timeouts.proxy_protocol;
        let Some(mut x) = self.take_state().await else {
            return Err(None);
        };
        loop {
            if x.cl.pending() > 0 {
                match parse_proxy_header(x.cl.bytes()) {
                    Ok(ProxyStatus::Complete(h)) => {
                        let (consumed, source) = (h.consumed, h.source);
                        x.cl.consume(consumed);
                        if let Some(src) = source {
                            self.ip = client_ip(src.ip());
                            self.id = ClientId::from_ip(self.ip);
                        }
                        return Ok(x);
                    }
                    Ok(ProxyStatus::Partial) => {}
                    Err(e) => {
                        crate::log_debug!("conn", "PROXY header refused: {}", e.as_str());
                        return Err(Some(ConnRefusal::ProxyHeaderInvalid));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Some(ConnRefusal::ProxyHeaderTimeout));
            }
            self.client.set_read_timeout(Some(left));
            match self.client.read(x.cl.spare()).await {
                Ok(0) => return Err(Some(ConnRefusal::ProxyHeaderInvalid)),
                Ok(n) => x.cl.filled(n),
                Err(e) if is_timeout(&e) => return Err(Some(ConnRefusal::ProxyHeaderTimeout)),
                Err(_) => return Err(Some(ConnRefusal::ProxyHeaderInvalid)),
            }
        }
    }

    /// Reads until a whole request head is in the exchange's client bytes.
    ///
    /// From [`State::Idle`] no buffer is held until a byte arrives. For the
    /// first request the wait is part of the head read: the whole head must
    /// come within the header timeout of the connection's start. Between
    /// requests the caller waited already ([`Conn::wait_between_requests`]:
    /// the keep-alive idle timeout, ended by a drain, moved by a reload),
    /// and once the first byte of a head has arrived the whole head must
    /// come within the header timeout.
    pub(super) async fn read_head(&mut self, first: bool, state: State) -> HeadRead {
        let mut deadline =
            first.then(|| self.shard.driver.now() + self.shard.rt.timeouts.client_header);
        let mut held = match state {
            State::Busy(mut x) => {
                x.scan = HeadScan::default();
                x
            }
            State::Idle => {
                if let Some(d) = deadline {
                    if !self.wait_first_bytes(d).await {
                        // Nothing of a head came: nothing to answer.
                        return HeadRead::Closed;
                    }
                }
                match self.take_state().await {
                    Some(x) => x,
                    None => return HeadRead::Closed,
                }
            }
        };
        // The generation the head is read on (the wait may have moved it).
        let shard = self.shard.clone();
        let t = &shard.rt.timeouts;
        let l = &shard.rt.config.limits;
        loop {
            let x: &mut super::Exchange = &mut held;
            if x.cl.pending() > 0 {
                match x
                    .scan
                    .feed(x.cl.bytes(), l.max_request_line, l.max_header_bytes)
                {
                    Scan::Candidate => match shard.req_parser.parse(x.cl.bytes(), &mut x.req) {
                        Ok(Status::Complete(())) => return HeadRead::Ready(held),
                        Ok(Status::Partial) => continue,
                        Err(e) => return HeadRead::Bad(e, held),
                    },
                    Scan::Refuse(e) => return HeadRead::Bad(e, held),
                    Scan::More => {}
                }
                if deadline.is_none() {
                    deadline = Some(shard.driver.now() + t.client_header);
                }
            } else {
                x.cl.clear();
            }
            x.cl.compact();
            if x.cl.is_full() {
                return HeadRead::Bad(ParseError::HeadersTooLarge, held);
            }
            let r = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(shard.driver.now());
                    if left.is_zero() {
                        return HeadRead::TimedOut(held);
                    }
                    self.client.set_read_timeout(Some(left));
                    self.client.read_lean(x.cl.spare()).await
                }
                None => {
                    // A pipelined head's first bytes are here; the rest is
                    // read like any head.
                    self.client.set_read_timeout(Some(t.client_header));
                    self.client.read_lean(x.cl.spare()).await
                }
            };
            match r {
                // EOF between requests is a clean close; inside a head there is
                // nobody left to answer.
                Ok(0) => return HeadRead::Closed,
                Ok(n) => x.cl.filled(n),
                Err(e) if is_timeout(&e) && x.has_pending() => return HeadRead::TimedOut(held),
                Err(_) => return HeadRead::Closed,
            }
        }
    }

    /// Waits for the first request's first bytes until `deadline` (the
    /// header timeout from the connection's start). `false`: closed or
    /// timed out (nothing of a head came: nothing to answer).
    async fn wait_first_bytes(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(self.shard.driver.now());
        if left.is_zero() {
            return false;
        }
        self.client.set_read_timeout(Some(left));
        self.client.readable().await.is_ok()
    }

    /// Waits between two requests for the next request's first bytes,
    /// within the keep-alive idle timeout (one deadline for the whole
    /// wait). A drain ends the wait. A reload closes the old generation's
    /// `shutdown` ([`shard::Shard::retire`]): the idle connection then
    /// follows to the newest generation at once and waits there, so it
    /// does not keep the old one (its runtime, its pools) alive; bytes of a
    /// new request follow the same way. `false`: the connection ends.
    pub(super) async fn wait_between_requests(&mut self) -> bool {
        let until = self.shard.driver.now() + self.shard.rt.timeouts.client_idle;
        loop {
            if self.shard.draining.get() {
                return false;
            }
            let left = until.saturating_duration_since(self.shard.driver.now());
            if left.is_zero() {
                return false;
            }
            self.client.set_read_timeout(Some(left));
            let woken = async {
                let _ = self.shard.shutdown.acquire(1).await;
                Err(io::Error::from(io::ErrorKind::Interrupted))
            };
            let bytes = match or(self.client.readable(), woken).await {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
                Err(_) => return false,
            };
            if !bytes && self.shard.draining.get() {
                return false;
            }
            // Bytes of a new request: it starts on the newest config.
            match shard::follow(&mut self.shard, self.li) {
                shard::Follow::Move(li) => self.li = li,
                // Woken with no newer generation to go to: an idle close
                // (RFC 9112 §9.5), never a spin on the closed semaphore.
                shard::Follow::Stay if !bytes => return false,
                shard::Follow::Stay => {}
                shard::Follow::Close => return false,
            }
            if bytes {
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_bytes(fields: usize) -> Vec<u8> {
        let mut h = b"GET /a HTTP/1.1\r\nHost: x\r\n".to_vec();
        for i in 0..fields {
            h.extend_from_slice(format!("X-F{i}: {}\r\n", "v".repeat(40)).as_bytes());
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    #[test]
    fn a_head_fed_one_byte_per_read_is_scanned_in_linear_time() {
        let h = head_bytes(200);
        let mut s = HeadScan::default();
        let mut found = None;
        for n in 1..=h.len() {
            match s.feed(&h[..n], 8192, 1 << 20) {
                Scan::Candidate => {
                    found = Some(n);
                    break;
                }
                Scan::More => {}
                Scan::Refuse(e) => panic!("refused {e:?}"),
            }
        }
        assert_eq!(found, Some(h.len()), "the end is found at the last byte");
        // Each byte is examined once, plus at most two look-aheads per line
        // feed re-examined while undecided.
        let lines = h.iter().filter(|&&b| b == b'\n').count() as u64;
        assert!(
            s.examined <= h.len() as u64 + 4 * lines,
            "examined {} bytes for a {}-byte head",
            s.examined,
            h.len()
        );
    }

    /// A head of about `size` bytes in fields of `line` bytes (the last
    /// one padded), as a slow-head client sends it.
    fn head_of(size: usize, line: usize) -> Vec<u8> {
        let mut h = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
        let mut i = 0;
        while h.len() + line + 4 <= size {
            let pre = format!("X-F{i}: ");
            h.extend_from_slice(pre.as_bytes());
            h.extend(std::iter::repeat_n(b'v', line - pre.len() - 2));
            h.extend_from_slice(b"\r\n");
            i += 1;
        }
        if size > h.len() + 11 {
            let pad = size - h.len() - 11;
            h.extend_from_slice(b"X-Pad: ");
            h.extend(std::iter::repeat_n(b'p', pad));
            h.extend_from_slice(b"\r\n");
        }
        h.extend_from_slice(b"\r\n");
        h
    }

    /// Feeds `h` to a fresh scanner in arrivals of the sizes `step` gives,
    /// as the head read does (the whole head so far each time); returns the
    /// bytes examined once the end is found.
    fn examined_until_end(h: &[u8], mut step: impl FnMut(usize) -> usize) -> u64 {
        let mut s = HeadScan::default();
        let mut n = 0;
        let mut k = 0;
        while n < h.len() {
            n = (n + step(k).max(1)).min(h.len());
            k += 1;
            match s.feed(&h[..n], 8192, 1 << 20) {
                Scan::Candidate => {
                    assert_eq!(n, h.len(), "the end is found where it is");
                    return s.examined;
                }
                Scan::More => {}
                Scan::Refuse(e) => panic!("refused {e:?}"),
            }
        }
        panic!("no end found in {} bytes", h.len());
    }

    /// The slow-head benchmark's shapes (a 32 KiB and a 256 KiB head, in
    /// 2 KiB fields or one field, one byte per arrival or odd-sized ones
    /// that split CRLFs): the work is the bytes, so eight times the bytes
    /// is at most eight times the work (plus the look-aheads at line ends),
    /// never more. A scanner that restarted from the head's start, or from
    /// its current line's, on each arrival would examine ~n²/2 bytes here.
    #[test]
    fn slow_heads_cost_their_bytes_whatever_their_size_and_shape() {
        for line in [2048, 300_000] {
            let small = head_of(32 * 1024, line.min(32 * 1024 - 64));
            let large = head_of(256 * 1024, line);
            let arrivals: [fn(usize) -> usize; 3] = [|_| 1, |k| 1 + (k * 7919) % 13, |k| 2 + k % 3];
            for step in arrivals {
                let a = examined_until_end(&small, step);
                let b = examined_until_end(&large, step);
                for (h, e) in [(&small, a), (&large, b)] {
                    let lines = h.iter().filter(|&&c| c == b'\n').count() as u64;
                    assert!(
                        e <= h.len() as u64 + 4 * lines,
                        "examined {e} bytes for a {}-byte head of {lines} lines",
                        h.len()
                    );
                }
                let ratio = b as f64 / a as f64;
                let bytes = large.len() as f64 / small.len() as f64;
                assert!(
                    ratio <= bytes * 1.01,
                    "8x the bytes cost {ratio:.2}x the scanning ({a} -> {b})"
                );
            }
        }
    }

    #[test]
    fn whole_head_in_one_read_is_a_candidate_once() {
        let h = head_bytes(3);
        let mut s = HeadScan::default();
        assert_eq!(s.feed(&h, 8192, 65536), Scan::Candidate);
    }

    #[test]
    fn bare_lf_heads_reach_the_parser() {
        let mut s = HeadScan::default();
        assert_eq!(
            s.feed(b"GET / HTTP/1.1\nHost: x\n\n", 8192, 65536),
            Scan::Candidate
        );
    }

    #[test]
    fn leading_empty_lines_are_not_an_end() {
        let mut s = HeadScan::default();
        assert_eq!(s.feed(b"\r\n\r\n", 8192, 65536), Scan::More);
        assert_eq!(
            s.feed(b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", 8192, 65536),
            Scan::Candidate
        );
    }

    #[test]
    fn an_endless_request_line_is_414_once_past_the_limit() {
        let mut s = HeadScan::default();
        let line = vec![b'a'; 100];
        assert_eq!(s.feed(&line[..60], 64, 1024), Scan::More);
        assert_eq!(
            s.feed(&line, 64, 1024),
            Scan::Refuse(ParseError::UriTooLong)
        );
    }

    #[test]
    fn an_endless_head_is_431_once_past_the_limit() {
        let mut h = b"GET / HTTP/1.1\r\n".to_vec();
        h.extend(std::iter::repeat_n(b'x', 2000));
        let mut s = HeadScan::default();
        assert_eq!(
            s.feed(&h, 64, 1024),
            Scan::Refuse(ParseError::HeadersTooLarge)
        );
    }
}
