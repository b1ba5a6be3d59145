//! The guest's memory allocator in the sandbox: bump allocation in 64 KiB chunks, each
//! chunk reused from its start as soon as everything allocated in it was freed.
//!
//! A record's work allocates many small, short-lived values (the input's fields, the
//! state's decoding, the output's JSON) and frees them all before the next record. A
//! general-purpose allocator searches free lists for each; here an allocation is a
//! pointer bump, a free is a counter decrement, and once a record's values are all freed
//! the chunk starts over, so the next record reuses the same, cache-warm memory. Nothing
//! is ever reused while a value in its chunk lives: a value that outlives its record (a
//! `static`, a cache the operator keeps) only keeps its chunk from being reused, and the
//! instance's memory cap bounds that as it bounds any leak.
//!
//! Allocations larger than [`LARGE`] go to the system allocator (the Rust standard
//! library's `dlmalloc`), which returns them to its free lists. Chunks are never given
//! back to it: memory that held a peak of small values serves small values after. This
//! module owns only that choice; the sandbox's memory cap is the host's.
//!
//! One assumption outside this file: the host denies WASI. wasi-libc's own code (the
//! environment, directory reads) frees with its `free()` what the host handed in
//! through `cabi_realloc`, which is this allocator once it is the global one; Sluice's
//! sandbox traps every WASI call (`host/src/operator/wasm/component.rs`, `deny_wasi`),
//! so that never happens there.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::ptr;

/// The size and alignment of a chunk: one WebAssembly page.
const CHUNK: usize = 64 * 1024;
/// Where a chunk's allocations start: its first bytes hold its [`Header`].
const HEADER: usize = 16;
/// The largest allocation made in a chunk; larger ones go to the system allocator.
pub const LARGE: usize = 8 * 1024;

// The header fits before the first allocation.
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

/// The start of every chunk.
struct Header {
    /// Allocations in the chunk not yet freed.
    live: usize,
    /// The next chunk on the free list, while the chunk is on it.
    next_free: *mut Header,
}

struct Chunks {
    /// The chunk allocations are bumped from; null before the first.
    current: *mut Header,
    /// The offset of the next allocation in `current`.
    bump: usize,
    /// Chunks all of whose allocations were freed, for reuse.
    free: *mut Header,
}

/// The allocator: `#[global_allocator]` of every component built with the SDK.
pub struct ChunkAllocator {
    chunks: UnsafeCell<Chunks>,
}

// A component instance runs on one thread: WebAssembly has no threads here (wasip2
// components are single-threaded), so the allocator's state is never shared.
unsafe impl Sync for ChunkAllocator {}

impl ChunkAllocator {
    /// An allocator holding no chunk yet.
    pub const fn new() -> Self {
        ChunkAllocator { chunks: UnsafeCell::new(Chunks { current: ptr::null_mut(), bump: 0, free: ptr::null_mut() }) }
    }
}

impl Default for ChunkAllocator {
    fn default() -> Self {
        Self::new()
    }
}

/// The chunk holding `ptr`, allocated in one.
fn chunk_of(ptr: *mut u8) -> *mut Header {
    (ptr as usize & !(CHUNK - 1)) as *mut Header
}

/// Whether `layout` is allocated in a chunk.
fn in_chunk(layout: Layout) -> bool {
    layout.size() <= LARGE && layout.align() <= HEADER
}

impl Chunks {
    /// Moves allocation to a fresh chunk: a freed one, or a new one from the system.
    /// (The current chunk still holds live values: once they are all freed it starts
    /// over, so anything up to [`LARGE`] fits it.)
    unsafe fn next_chunk(&mut self) -> bool {
        let chunk = if self.free.is_null() {
            let chunk = unsafe { System.alloc(Layout::from_size_align_unchecked(CHUNK, CHUNK)) } as *mut Header;
            if chunk.is_null() {
                return false;
            }
            chunk
        } else {
            let chunk = self.free;
            self.free = unsafe { (*chunk).next_free };
            chunk
        };
        unsafe { chunk.write(Header { live: 0, next_free: ptr::null_mut() }) };
        // The chunk left behind still has live values; it joins the free list when
        // their last is freed.
        self.current = chunk;
        self.bump = HEADER;
        true
    }

    unsafe fn alloc(&mut self, layout: Layout) -> *mut u8 {
        let align = layout.align();
        let mut start = (self.bump + align - 1) & !(align - 1);
        if self.current.is_null() || start + layout.size() > CHUNK {
            if !unsafe { self.next_chunk() } {
                return ptr::null_mut();
            }
            start = (self.bump + align - 1) & !(align - 1);
        }
        self.bump = start + layout.size();
        unsafe { (*self.current).live += 1 };
        unsafe { (self.current as *mut u8).add(start) }
    }

    unsafe fn dealloc(&mut self, ptr: *mut u8) {
        let chunk = chunk_of(ptr);
        unsafe { (*chunk).live -= 1 };
        if unsafe { (*chunk).live } > 0 {
            return;
        }
        if chunk == self.current {
            self.bump = HEADER;
        } else {
            unsafe { (*chunk).next_free = self.free };
            self.free = chunk;
        }
    }

    /// Grows or shrinks the allocation at `ptr` in place when it is the last one bumped
    /// (a `Vec` being filled); says whether it could.
    unsafe fn resize_in_place(&mut self, ptr: *mut u8, old: usize, new: usize) -> bool {
        let end = ptr as usize + old;
        let current_end = self.current as usize + self.bump;
        if chunk_of(ptr) != self.current || end != current_end {
            return false;
        }
        let start = ptr as usize - self.current as usize;
        if start + new > CHUNK {
            return false;
        }
        self.bump = start + new;
        true
    }
}

unsafe impl GlobalAlloc for ChunkAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !in_chunk(layout) {
            return unsafe { System.alloc(layout) };
        }
        unsafe { (*self.chunks.get()).alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !in_chunk(layout) {
            return unsafe { System.dealloc(ptr, layout) };
        }
        unsafe { (*self.chunks.get()).dealloc(ptr) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (in_chunk(layout), in_chunk(new_layout)) {
            (false, false) => return unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                let chunks = unsafe { &mut *self.chunks.get() };
                if unsafe { chunks.resize_in_place(ptr, layout.size(), new_size) } {
                    return ptr;
                }
            }
            _ => {}
        }
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            unsafe { ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `size` bytes at alignment `align`.
    fn aligned(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    /// What a record does: values allocated, then all freed; the next record's values
    /// land where the last one's did.
    #[test]
    fn a_chunk_whose_values_were_all_freed_starts_over() {
        let allocator = ChunkAllocator::new();
        unsafe {
            let first = allocator.alloc(aligned(96, 8));
            let second = allocator.alloc(aligned(96, 8));
            assert_eq!(chunk_of(first), chunk_of(second));
            assert!(second > first);
            allocator.dealloc(first, aligned(96, 8));
            assert_eq!(allocator.alloc(aligned(8, 8)), second.add(96), "not reused while a value lives");
            allocator.dealloc(second, aligned(96, 8));
            allocator.dealloc(second.add(96), aligned(8, 8));
            assert_eq!(allocator.alloc(aligned(96, 8)), first, "reused from the start once all were freed");
        }
    }

    /// Random allocations, frees and reallocations of every size class and alignment
    /// against a model of what each live value holds: no live value is ever overwritten,
    /// every pointer is aligned, and chunks are reused rather than leaked.
    #[test]
    fn live_values_are_never_overwritten() {
        let allocator = ChunkAllocator::new();
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let mut chunks = std::collections::HashSet::new();
        let mut seed = 11u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            seed >> 33
        };
        let check = |&(ptr, layout, fill): &(*mut u8, Layout, u8)| {
            let bytes = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            assert!(bytes.iter().all(|&b| b == fill), "a live value of {} bytes was overwritten", layout.size());
        };
        for step in 0..200_000u64 {
            let size = match next() % 10 {
                0 => 1 + next() as usize % (3 * LARGE),
                _ => 1 + next() as usize % 300,
            };
            let align = [1, 8, 16, 32][next() as usize % 4];
            match next() % 3 {
                0 if !live.is_empty() => {
                    let value = live.swap_remove(next() as usize % live.len());
                    check(&value);
                    unsafe { allocator.dealloc(value.0, value.1) };
                }
                1 if !live.is_empty() => {
                    let index = next() as usize % live.len();
                    let (ptr, old, fill) = live[index];
                    check(&live[index]);
                    let ptr = unsafe { allocator.realloc(ptr, old, size) };
                    assert!(!ptr.is_null() && (ptr as usize).is_multiple_of(old.align()));
                    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, size) };
                    assert!(bytes[..old.size().min(size)].iter().all(|&b| b == fill), "realloc kept the value");
                    bytes.fill(fill);
                    live[index] = (ptr, aligned(size, old.align()), fill);
                }
                _ => {
                    let layout = aligned(size, align);
                    let ptr = unsafe { allocator.alloc(layout) };
                    assert!(!ptr.is_null() && (ptr as usize).is_multiple_of(align));
                    if in_chunk(layout) {
                        chunks.insert(chunk_of(ptr));
                    }
                    let fill = step as u8;
                    unsafe { std::slice::from_raw_parts_mut(ptr, size) }.fill(fill);
                    live.push((ptr, layout, fill));
                }
            }
            // Now and then a record ends: most of its values are freed.
            if step % 1000 == 999 {
                for value in live.drain(live.len() / 10..) {
                    check(&value);
                    unsafe { allocator.dealloc(value.0, value.1) };
                }
            }
        }
        live.iter().for_each(check);
        // About 10 MB of small values were allocated over the run (150 chunks' worth),
        // never more than a few tens of KB of them live at once: chunks freed are taken
        // again (two were, when written).
        assert!(chunks.len() <= 8, "{} chunks used", chunks.len());
    }
}
