//! Byte buffers backed by their own anonymous mapping: pages are touched only as bytes are written, and all of it goes back to the OS on drop.
//!
//! A connection's buffers are sized for the largest head or streaming chunk
//! it may see, but most requests fill one page of each. Mapped buffers cost
//! resident memory only for the pages written, never fragment the heap, and
//! are returned whole by `munmap`, so memory after a burst of connections
//! falls back to where it started.

use std::io;
use std::ops::{Deref, DerefMut};

/// An anonymous private mapping, unmapped on drop.
pub(super) struct Mapping {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Mapping {
    pub(super) fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: anonymous private mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len: len.max(1),
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len == 0 {
            // `Buf::empty`'s: nothing was mapped.
            return;
        }
        // SAFETY: ptr/len are the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A fixed-size, zero-initialised byte buffer in its own mapping.
pub struct Buf {
    map: Mapping,
    len: usize,
}

impl Buf {
    /// A buffer of `len` bytes, or the kernel's refusal of the mapping
    /// (`ENOMEM`: the address space or `vm.max_map_count` is exhausted). It
    /// never panics: a connection that cannot get its buffer can be
    /// answered (503) or closed while the rest of the shard goes on.
    pub fn try_new(len: usize) -> io::Result<Buf> {
        Ok(Buf {
            map: Mapping::new(len)?,
            len,
        })
    }

    /// A buffer of no bytes, with no mapping (what is left when a new
    /// mapping is refused and the old one cannot be written).
    pub fn empty() -> Buf {
        Buf {
            map: Mapping {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            },
            len: 0,
        }
    }

    /// A buffer of `len` bytes; panics (an abort of the whole process in
    /// release builds, `panic = "abort"`) when the kernel refuses the
    /// mapping. Kept only for the callers not yet moved to
    /// [`Buf::try_new`], which is what new code uses.
    pub fn new(len: usize) -> Buf {
        match Buf::try_new(len) {
            Ok(b) => b,
            Err(e) => panic!("cannot map a {len}-byte buffer: {e}"),
        }
    }
}

impl Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes (zero-filled by the kernel).
        unsafe { std::slice::from_raw_parts(self.map.ptr, self.len) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` writable bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr, self.len) }
    }
}
