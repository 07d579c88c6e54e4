//! The few RESP2 frames the fleet sync needs (commands out, integer/bulk/array/error replies in), over a blocking std `TcpStream` on the sync thread.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Longest bulk string or array accepted from Redis: a reply to HVALS on one key
/// holds one small integer per box, so anything near this is a protocol error.
const MAX_LEN: usize = 1 << 20;

/// A reply, as far as the sync reads them.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Status,
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
    Error(String),
}

/// Appends one command (an array of bulk strings) to `out`.
pub fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// One connection to Redis with a deadline per exchange.
pub struct Conn {
    r: BufReader<TcpStream>,
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
}

impl Conn {
    /// Connects to `addr` (`host:port`) within `timeout`.
    pub fn connect(addr: &str, timeout: Duration) -> io::Result<Conn> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Conn {
                        r: BufReader::new(s),
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Writes `pipeline` (`n` commands) and reads `n` replies, all before `deadline`.
    pub fn exchange(
        &mut self,
        pipeline: &[u8],
        n: usize,
        deadline: Instant,
    ) -> io::Result<Vec<Reply>> {
        let left = |d: Instant| {
            d.checked_duration_since(Instant::now())
                .filter(|t| !t.is_zero())
                .ok_or_else(timed_out)
        };
        self.r.get_ref().set_write_timeout(Some(left(deadline)?))?;
        self.r.get_mut().write_all(pipeline)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            self.r.get_ref().set_read_timeout(Some(left(deadline)?))?;
            out.push(read(&mut self.r, 0)?);
        }
        Ok(out)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("RESP: {what}"))
}

fn line(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut l = Vec::new();
    Read::take(&mut *r, MAX_LEN as u64).read_until(b'\n', &mut l)?;
    if !l.ends_with(b"\r\n") {
        return Err(bad("line without CRLF"));
    }
    l.truncate(l.len() - 2);
    Ok(l)
}

fn int(b: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("not an integer"))
}

/// Reads one reply (arrays nest at most 4 deep).
pub fn read(r: &mut impl BufRead, depth: u8) -> io::Result<Reply> {
    let l = line(r)?;
    let (&kind, rest) = l.split_first().ok_or_else(|| bad("empty line"))?;
    Ok(match kind {
        b'+' => Reply::Status,
        b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
        b':' => Reply::Int(int(rest)?),
        b'$' => {
            let n = int(rest)?;
            if n < 0 {
                return Ok(Reply::Bulk(None));
            }
            let n = n as usize;
            if n > MAX_LEN {
                return Err(bad("bulk string too long"));
            }
            let mut v = vec![0; n + 2];
            r.read_exact(&mut v)?;
            if !v.ends_with(b"\r\n") {
                return Err(bad("bulk string without CRLF"));
            }
            v.truncate(n);
            Reply::Bulk(Some(v))
        }
        b'*' => {
            let n = int(rest)?;
            if n < 0 {
                return Ok(Reply::Array(Vec::new()));
            }
            if n as usize > MAX_LEN || depth >= 4 {
                return Err(bad("array too long or too deep"));
            }
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(read(r, depth + 1)?);
            }
            Reply::Array(v)
        }
        _ => return Err(bad("unknown reply type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_replies() {
        let mut out = Vec::new();
        command(&mut out, &[b"HSET", b"k", b"f", b"12"]);
        assert_eq!(
            out,
            b"*4\r\n$4\r\nHSET\r\n$1\r\nk\r\n$1\r\nf\r\n$2\r\n12\r\n"
        );
        let mut r: &[u8] = b"+OK\r\n:1\r\n*2\r\n$2\r\n10\r\n$1\r\n5\r\n$-1\r\n-ERR wrong\r\n*0\r\n";
        assert_eq!(read(&mut r, 0).unwrap(), Reply::Status);
        assert_eq!(read(&mut r, 0).unwrap(), Reply::Int(1));
        assert_eq!(
            read(&mut r, 0).unwrap(),
            Reply::Array(vec![
                Reply::Bulk(Some(b"10".to_vec())),
                Reply::Bulk(Some(b"5".to_vec()))
            ])
        );
        assert_eq!(read(&mut r, 0).unwrap(), Reply::Bulk(None));
        assert_eq!(read(&mut r, 0).unwrap(), Reply::Error("ERR wrong".into()));
        assert_eq!(read(&mut r, 0).unwrap(), Reply::Array(vec![]));
        let mut bad: &[u8] = b"$5\r\nab\r\n";
        assert!(read(&mut bad, 0).is_err());
        let mut bad: &[u8] = b"?x\r\n";
        assert!(read(&mut bad, 0).is_err());
    }
}
