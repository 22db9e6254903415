//! A heap buffer whose start is aligned for direct I/O, used for segment
//! writes (`writer.rs`, which seals chunks straight into it) and as the
//! bounce buffer of direct reads (`read_direct`, for run reads and span
//! reads): filling or emptying it is a plain memcpy, far cheaper than the
//! kernel's copy through the page cache it replaces.

use crate::error::Result;
use cairn_devices::{Device, DIRECT_ALIGN};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::RefCell;

/// Chunks of at most this many raw bytes (the blocks of 4 KiB and 16 KiB
/// volumes and small-record files) are written and read through the
/// host's page cache, which then serves their random reads from memory as
/// it does for a raw image; larger chunks (sequential data, which the
/// FUSE page cache holds) are written and read past it. A segment buffer
/// is written through the cache when at least half its bytes are such
/// chunks (`WriteBatch`).
pub const CACHED_CHUNK: u32 = 16 << 10;

/// True if I/O of a chunk of `raw_len` bytes goes through the page cache.
pub(crate) fn cached(raw_len: u32) -> bool {
    raw_len <= CACHED_CHUNK
}

pub struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
    /// Mapped by `huge` (unmapped on drop) rather than allocated.
    mapped: bool,
}

const HUGE: usize = 2 << 20;

// SAFETY: the buffer is plain owned memory, used through &/&mut only.
unsafe impl Send for AlignedBuf {}
// SAFETY: through & only shared slices are handed out (`slice`); writes
// need &mut (`slice_mut`).
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `cap` bytes (rounded up to `align`), zeroed, starting at a multiple of
    /// `align` (a power of two).
    pub fn new(cap: usize, align: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(cap.next_multiple_of(align).max(align), align)
            .expect("aligned buffer layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf {
            ptr,
            layout,
            mapped: false,
        }
    }

    /// At least `cap` bytes, zeroed, in whole 2 MiB huge pages where the
    /// kernel allows (transparent huge pages on madvise): direct I/O then
    /// pins one page per 2 MiB instead of one per 4 KiB. The memory is
    /// mapped and advised before anything touches it, since a page
    /// faulted in small stays small.
    pub fn huge(cap: usize) -> AlignedBuf {
        let size = cap.next_multiple_of(HUGE).max(HUGE);
        let layout = Layout::from_size_align(size, HUGE).expect("huge buffer layout");
        let ptr = map_huge(size).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            layout,
            mapped: true,
        }
    }

    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The first `len` bytes (at most the capacity), as they are.
    pub fn slice(&self, len: usize) -> &[u8] {
        assert!(len <= self.capacity());
        // SAFETY: ptr is valid for capacity() bytes and owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }

    /// The first `len` bytes (at most the capacity), as they are.
    pub fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.capacity());
        // SAFETY: ptr is valid for capacity() bytes and owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped in `huge` with this size; nothing borrows it.
            unsafe { libc::munmap(self.ptr.cast(), self.layout.size()) };
        } else {
            // SAFETY: allocated in `new` with this layout.
            unsafe { dealloc(self.ptr, self.layout) }
        }
    }
}

/// Reads the device's bytes `at..at + len` past the host's page cache: one
/// direct read of the aligned range around them into this thread's bounce
/// buffer, handed to `f`. None, having read nothing, when the device
/// cannot do direct I/O (the caller reads buffered). Direct reads keep a
/// second copy of what the FUSE page cache holds out of the host's page
/// cache, and a small read costs the device blocks it touches only.
#[allow(
    clippy::cast_possible_truncation,
    reason = "at - start is below the alignment; u64 to usize is lossless: cairn-devices asserts a 64-bit target"
)]
pub fn read_direct<R>(
    dev: &Device,
    at: u64,
    len: usize,
    f: impl FnOnce(&[u8]) -> Result<R>,
) -> Result<Option<R>> {
    thread_local! {
        static BOUNCE: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
    }
    BOUNCE.with_borrow_mut(|bounce| {
        let start = at - at % DIRECT_ALIGN as u64;
        let skip = (at - start) as usize;
        let span = (skip + len).next_multiple_of(DIRECT_ALIGN);
        if bounce.as_ref().is_none_or(|b| b.capacity() < span) {
            *bounce = Some(AlignedBuf::huge(span));
        }
        let buf = bounce.as_mut().expect("bounce buffer").slice_mut(span);
        if !dev.read_direct_at(buf, start, skip + len)? {
            return Ok(None);
        }
        f(&buf[skip..skip + len]).map(Some)
    })
}

/// Maps `size` (a multiple of 2 MiB) zeroed bytes at a 2 MiB boundary,
/// advised as huge pages; None when out of memory.
fn map_huge(size: usize) -> Option<*mut u8> {
    let len = size + HUGE;
    // SAFETY: a fresh private anonymous mapping; we own all of it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = (p as usize).next_multiple_of(HUGE);
    let head = start - p as usize;
    // SAFETY: the unaligned head and the tail beyond `size` are ours and
    // unused; advice on the rest only loses the speedup if refused.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if len - head > size {
            libc::munmap((start + size) as *mut libc::c_void, len - head - size);
        }
        libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
    }
    Some(start as *mut u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_is_zeroed_aligned_and_rounded_up() {
        let mut b = AlignedBuf::new(10_000, 4096);
        assert_eq!(b.capacity(), 12_288);
        let all = b.slice_mut(12_288);
        assert_eq!(all.as_ptr() as usize % 4096, 0);
        assert!(all.iter().all(|&x| x == 0));
    }

    #[test]
    fn huge_is_zeroed_aligned_and_whole() {
        let mut b = AlignedBuf::huge(3 << 20);
        assert_eq!(b.capacity(), 4 << 20);
        let all = b.slice_mut(4 << 20);
        assert_eq!(all.as_ptr() as usize % HUGE, 0);
        assert!(all.iter().all(|&x| x == 0));
        all[(4 << 20) - 1] = 9; // the whole capacity is writable
        drop(b);
        assert_eq!(AlignedBuf::huge(1).capacity(), HUGE);
    }
}
