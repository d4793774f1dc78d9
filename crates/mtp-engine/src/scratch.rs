//! Recycled buffers for a forward's large transient values (products, activations, the copies a
//! layer makes of its input), kept between forwards as llama.cpp keeps its compute buffers.
//!
//! A prefill's per-layer buffers are megabytes each. Freed to the system allocator, they go back
//! to the OS (glibc unmaps anything over its mmap threshold; mimalloc purges what stayed unused
//! for 10 ms, e.g. between two requests), and the next forward faults every page in again, zeroed
//! by the kernel: that was 10-25% of a 1000-token prefill's time on the benchmark shape. Here a
//! forward takes its large buffers from a small pool and hands them back when done with them;
//! a buffer not handed back is simply freed, so forgetting one costs speed, never correctness.
//!
//! The pool keeps at most [`KEEP_BUFFERS`] buffers and [`KEEP_BYTES`] bytes (the oldest go first);
//! buffers under [`MIN_FLOATS`] floats (a decode step's) are left to the allocator.

use std::sync::Mutex;

/// Buffers smaller than this many floats (256 KiB) are not pooled.
pub(crate) const MIN_FLOATS: usize = 1 << 16;
/// Most buffers the pool keeps.
pub(crate) const KEEP_BUFFERS: usize = 48;
/// Most bytes the pool keeps (1 GiB).
pub(crate) const KEEP_BYTES: usize = 1 << 30;

/// Buffers kept for reuse, oldest first.
struct Pool {
    bufs: Vec<Vec<f32>>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { bufs: Vec::new() });

fn with_pool<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    // a panic while the lock was held leaves a list of valid buffers: go on with it
    f(&mut POOL.lock().unwrap_or_else(|e| e.into_inner()))
}

impl Pool {
    /// The smallest buffer that holds `len` floats without wasting more than 3/4 of itself,
    /// taken out (its contents are whatever its last user left).
    fn fitting(&mut self, len: usize) -> Option<Vec<f32>> {
        if len < MIN_FLOATS {
            return None;
        }
        let best = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 4 <= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        Some(self.bufs.remove(best))
    }

    fn zeroed(&mut self, len: usize) -> Vec<f32> {
        match self.fitting(len) {
            Some(mut v) => {
                v.clear();
                v.resize(len, 0.0);
                v
            }
            None => vec![0.0; len],
        }
    }

    fn overwritten(&mut self, len: usize) -> Vec<f32> {
        match self.fitting(len) {
            Some(mut v) => {
                // keeps what is there (already initialized floats) and zero-fills only growth
                v.resize(len, 0.0);
                v
            }
            None => vec![0.0; len],
        }
    }

    fn with_capacity(&mut self, cap: usize) -> Vec<f32> {
        match self.fitting(cap) {
            Some(mut v) => {
                v.clear();
                v
            }
            None => Vec::with_capacity(cap),
        }
    }

    fn recycle(&mut self, v: Vec<f32>) {
        if v.capacity() < MIN_FLOATS {
            return;
        }
        self.bufs.push(v);
        let mut bytes: usize = self.bufs.iter().map(|b| b.capacity() * 4).sum();
        while self.bufs.len() > KEEP_BUFFERS || bytes > KEEP_BYTES {
            let old = self.bufs.remove(0);
            bytes -= old.capacity() * 4;
        }
    }
}

/// `len` zeros.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    if len < MIN_FLOATS {
        return vec![0.0; len];
    }
    with_pool(|p| p.zeroed(len))
}

/// `len` floats of unspecified value (a pooled buffer's earlier contents, or zeros), for a
/// caller that writes every one before it reads any: saves [`zeroed`]'s pass over the memory.
pub(crate) fn overwritten(len: usize) -> Vec<f32> {
    if len < MIN_FLOATS {
        return vec![0.0; len];
    }
    with_pool(|p| p.overwritten(len))
}

/// An empty buffer with room for `cap` floats.
pub(crate) fn with_capacity(cap: usize) -> Vec<f32> {
    if cap < MIN_FLOATS {
        return Vec::with_capacity(cap);
    }
    with_pool(|p| p.with_capacity(cap))
}

/// A copy of `x`.
pub(crate) fn copy(x: &[f32]) -> Vec<f32> {
    let mut v = with_capacity(x.len());
    v.extend_from_slice(x);
    v
}

/// Hands `v` back for a later forward (freed at once when it is small or the pool is full).
pub(crate) fn recycle(v: Vec<f32>) {
    if v.capacity() >= MIN_FLOATS {
        with_pool(|p| p.recycle(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_zeroed_or_overwritten_at_the_length_asked() {
        let mut p = Pool { bufs: Vec::new() };
        let mut a = p.zeroed(MIN_FLOATS * 2);
        a.iter_mut().for_each(|x| *x = f32::NAN);
        let ptr = a.as_ptr();
        p.recycle(a);
        // the same memory again, cleared
        let b = p.zeroed(MIN_FLOATS + 5);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(b.len(), MIN_FLOATS + 5);
        assert!(b.iter().all(|&x| x == 0.0));
        p.recycle(b);
        // `overwritten` keeps the contents, at the new length
        let mut c = p.overwritten(MIN_FLOATS * 2);
        assert_eq!((c.as_ptr(), c.len()), (ptr, MIN_FLOATS * 2));
        c[0] = 7.0;
        p.recycle(c);
        let c = p.overwritten(MIN_FLOATS * 2);
        assert_eq!(c[0], 7.0);
        p.recycle(c);
        let mut d = p.with_capacity(MIN_FLOATS);
        assert_eq!((d.as_ptr(), d.len()), (ptr, 0));
        d.extend_from_slice(&[1.0; MIN_FLOATS]);
        p.recycle(d);
        // too small a request, or one a pooled buffer would hold with much to spare: fresh
        let e = p.zeroed(MIN_FLOATS / 2);
        assert!(e.iter().all(|&x| x == 0.0));
        assert_ne!(e.as_ptr(), ptr);
        let f = p.with_capacity(MIN_FLOATS * 20);
        assert!(f.is_empty() && f.capacity() >= MIN_FLOATS * 20);
        p.recycle(vec![0.0; 8]);
        assert_eq!(p.bufs.len(), 1);
        // and through the process-wide pool
        let g = copy(&[3.0; MIN_FLOATS + 1]);
        assert_eq!((g.len(), g[MIN_FLOATS]), (MIN_FLOATS + 1, 3.0));
        recycle(g);
        assert!(zeroed(MIN_FLOATS + 1).iter().all(|&x| x == 0.0));
        assert_eq!(overwritten(10), vec![0.0; 10]);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_the_newest_buffers() {
        let mut p = Pool { bufs: Vec::new() };
        for i in 0..KEEP_BUFFERS + 10 {
            p.recycle(vec![i as f32; MIN_FLOATS]);
        }
        assert_eq!(p.bufs.len(), KEEP_BUFFERS);
        assert_eq!(p.bufs[0][0], 10.0, "the oldest went first");
        // the byte budget: a few huge buffers push the rest out
        let huge = KEEP_BYTES / 4 / 3;
        for _ in 0..4 {
            p.recycle(Vec::with_capacity(huge));
        }
        assert!(p.bufs.iter().map(|b| b.capacity() * 4).sum::<usize>() <= KEEP_BYTES);
        assert_eq!(p.bufs.len(), 3);
    }
}
