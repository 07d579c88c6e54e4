//! Moving an iovec list past the bytes a short `sendmsg` wrote: the relayed and the gathered sends resume from there.

/// Advances `iov[*first..n]` past `k` bytes written: the iovecs written
/// whole are skipped (`*first` moves on), a partly written one then starts
/// after its written bytes.
pub(super) fn advance(iov: &mut [libc::iovec], first: &mut usize, n: usize, mut k: usize) {
    while k > 0 && *first < n {
        let v = &mut iov[*first];
        if k >= v.iov_len {
            k -= v.iov_len;
            *first += 1;
        } else {
            // SAFETY: k < iov_len: still inside the same iovec's memory.
            v.iov_base = unsafe { v.iov_base.cast::<u8>().add(k) }.cast();
            v.iov_len -= k;
            k = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::advance;

    #[test]
    fn a_short_write_skips_whole_iovecs_and_enters_the_next_at_its_byte() {
        let (a, b, c) = ([1u8; 4], [2u8; 5], [3u8; 6]);
        let mut iov = [&a[..], &b[..], &c[..]].map(|s| libc::iovec {
            iov_base: s.as_ptr() as *mut libc::c_void,
            iov_len: s.len(),
        });
        let mut first = 0;
        advance(&mut iov, &mut first, 3, 6);
        assert_eq!(first, 1);
        assert_eq!(iov[1].iov_len, 3);
        assert_eq!(iov[1].iov_base as usize, b.as_ptr() as usize + 2);
        advance(&mut iov, &mut first, 3, 3);
        assert_eq!((first, iov[2].iov_len), (2, 6));
        advance(&mut iov, &mut first, 3, 6);
        assert_eq!(first, 3);
    }
}
