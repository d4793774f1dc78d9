//! [`Aligned`]: buffers (of f32, or of the KV cache's half-precision values) that start on a
//! cache line, for the values kernels read many times.

/// Values held from a 64-byte boundary on, for buffers that kernels read many times: the input
/// rows of the packed products ([`super::qdot`]), the keys and values of the attention cache
/// ([`crate::cache::KvCache`]) and attention's queries. With rows of a multiple of 16 values,
/// every 64-byte vector load of them then sits in one cache line. From a buffer 16 bytes off a
/// line (where the allocator puts large ones) each such load was split in two, and on AVX-512,
/// where vector loads share two ports: a 4-bit product with 4 input rows ran 40% longer
/// (`examples/matmul_rows 0.5 201 q4` on one thread: 144 -> 103 µs; a C copy of the loop
/// alike); attention over 4096 cached positions for 512 queries 25-30% longer (`--example
/// attention -- 512 16 2 256 4096 3`: 202-206 ms aligned, 241-247 with the keys and values
/// off, 265-276 with the queries off too), one decode query 10-15% (`1 8 2 128 1500 400`:
/// 71-79 µs against 82-85). The f32 and bf16 few-row products, bound by the weights' stream,
/// did not change with it (`matmul_rows 256 7 f32`, `128 9 bf16`), and take their inputs where
/// they lie.
///
/// It grows like a `Vec` (to twice its length at least), moving its values to a new aligned
/// buffer; a clone is aligned too. Room asked for ahead ([`Aligned::reserve`],
/// [`Aligned::copy_with_room`]) is allocated but not written, so it costs address space, not
/// memory, until values go there: a KV cache given room for its prompt and reply never grows
/// by a copy. Growing by a copy at the end of a 32k-token prompt (the cache sized exactly to
/// it, as a part-by-part prefill or a resumed state leaves it) cost about a second on the
/// first decoded token: four 65 MB buffers copied into fresh pages, each page faulted in
/// (`cargo xtask bench --target-only --model /tmp/moe-oracle-q4 --prompt-len 32000 --tokens
/// 32`: decode 16.8 tok/s against 43.7 without the copy).
pub(crate) struct Aligned<T = f32> {
    /// `at` values before the first line boundary, then the `len` values; its capacity is the
    /// room.
    buf: Vec<T>,
    at: usize,
    len: usize,
}

impl<T> Default for Aligned<T> {
    fn default() -> Self {
        Aligned {
            buf: Vec::new(),
            at: 0,
            len: 0,
        }
    }
}

impl<T: Copy + Default> Aligned<T> {
    /// Values in a 64-byte line.
    const LINE: usize = 64 / std::mem::size_of::<T>();

    /// Room for `room` values (at least `len`), of which the first `len` are written by `fill`
    /// (given them zeroed).
    fn with_room(len: usize, room: usize, fill: impl FnOnce(&mut [T])) -> Aligned<T> {
        let mut buf: Vec<T> = Vec::with_capacity(room.max(len) + Self::LINE - 1);
        // `buf` is aligned to its values (all of 1, 2 or 4 bytes, dividing 64), so the first
        // line boundary is a whole number of values on
        let at = (64 - buf.as_ptr() as usize % 64) % 64 / std::mem::size_of::<T>();
        buf.resize(at + len, T::default());
        fill(&mut buf[at..]);
        Aligned { buf, at, len }
    }

    /// `len` values written by `fill` (given them zeroed).
    pub(crate) fn filled(len: usize, fill: impl FnOnce(&mut [T])) -> Aligned<T> {
        Aligned::with_room(len, len, fill)
    }

    /// A copy of `x`.
    pub(crate) fn copy(x: &[T]) -> Aligned<T> {
        Aligned::filled(x.len(), |out| out.copy_from_slice(x))
    }

    /// A copy of `x` with room for `room` values (see the type's docs).
    pub(crate) fn copy_with_room(x: &[T], room: usize) -> Aligned<T> {
        Aligned::with_room(x.len(), room, |out| out.copy_from_slice(x))
    }

    pub(crate) fn values(&self) -> &[T] {
        &self.buf[self.at..self.at + self.len]
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Values it holds without moving.
    pub(crate) fn room(&self) -> usize {
        self.buf.capacity().saturating_sub(self.at)
    }

    /// Makes room for `room` values in all (a move of its values when there is less).
    pub(crate) fn reserve(&mut self, room: usize) {
        if room > self.room() {
            *self = Aligned::copy_with_room(self.values(), room);
        }
    }

    /// Appends `x`.
    pub(crate) fn extend_from_slice(&mut self, x: &[T]) {
        self.make_room(x.len());
        self.buf.extend_from_slice(x);
        self.len += x.len();
    }

    /// Appends `n` values written by `fill` (given them as `T::default()`): a KV cache converts
    /// new f32 rows into its half-precision values in place.
    pub(crate) fn extend_with(&mut self, n: usize, fill: impl FnOnce(&mut [T])) {
        self.make_room(n);
        let need = self.len + n;
        self.buf.resize(self.at + need, T::default());
        fill(&mut self.buf[self.at + self.len..]);
        self.len = need;
    }

    /// Room for `n` more values: grows to twice its length at least when there is less.
    fn make_room(&mut self, n: usize) {
        let need = self.len + n;
        if need > self.room() {
            self.reserve(need.max(2 * self.len));
        }
    }

    /// Keeps the first `len` values (all when there are fewer).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.buf.truncate(self.at + self.len);
    }
}

impl<T: Copy + Default> Clone for Aligned<T> {
    fn clone(&self) -> Aligned<T> {
        Aligned::copy(self.values())
    }
}

impl<T: Copy + Default + std::fmt::Debug> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.values()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::rng;

    /// An aligned copy starts on a line boundary and holds the values, for every length and
    /// every offset of the source.
    #[test]
    fn aligned_copies_start_on_a_line() {
        let src: Vec<f32> = (0..100).map(|i| i as f32 * 0.5 - 7.0).collect();
        for at in 0..17 {
            for len in [0, 1, 15, 16, 17, 64, 83 - at] {
                let x = &src[at..at + len];
                let a = Aligned::copy(x);
                assert_eq!(a.values().as_ptr() as usize % 64, 0, "{at} {len}");
                assert_eq!(a.values(), x, "{at} {len}");
                let r = Aligned::<f32>::filled(len, |out| out.iter_mut().for_each(|v| *v += 2.0));
                assert_eq!(r.values().as_ptr() as usize % 64, 0, "{at} {len}");
                assert!(r.values().iter().all(|&v| v == 2.0), "{at} {len}");
                // half-precision values (a KV cache's) too, appended in place
                let h: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
                let mut a = Aligned::copy(&h[..len / 2]);
                a.extend_with(len - len / 2, |out| {
                    out.iter_mut()
                        .zip(&x[len / 2..])
                        .for_each(|(o, &v)| *o = half::f16::from_f32(v))
                });
                assert_eq!(a.values().as_ptr() as usize % 64, 0, "{at} {len}");
                assert_eq!(a.values(), &h[..], "{at} {len}");
            }
        }
    }

    /// A growing buffer stays aligned and holds what was appended, through truncations and
    /// clones (the attention cache's life: a prompt, steps, rolled-back verifies, snapshots).
    #[test]
    fn aligned_buffers_grow_like_vecs() {
        let mut a = Aligned::default();
        let mut want: Vec<f32> = Vec::new();
        assert!(a.len() == 0 && a.values().is_empty());
        let mut next = rng(5);
        for round in 0..200usize {
            let add: Vec<f32> = (0..(round * 7) % 37).map(|_| next()).collect();
            a.extend_from_slice(&add);
            want.extend_from_slice(&add);
            if round % 5 == 4 {
                let keep = want.len() * 2 / 3;
                a.truncate(keep);
                want.truncate(keep);
            }
            assert_eq!(a.len(), want.len());
            assert_eq!(a.values(), &want[..], "round {round}");
            let c = a.clone();
            assert_eq!(c.values(), &want[..]);
            // (an empty buffer's address is never read)
            if !want.is_empty() {
                assert_eq!(a.values().as_ptr() as usize % 64, 0, "round {round}");
                assert_eq!(c.values().as_ptr() as usize % 64, 0);
            }
        }
        a.truncate(usize::MAX);
        assert_eq!(a.len(), want.len());
    }

    /// Room asked for ahead holds every append up to it in place (the KV cache of a sequence
    /// given room for its prompt and reply never moves), aligned, through truncations; a copy
    /// with room holds the values and the room; past the room it grows as before.
    #[test]
    fn room_asked_for_keeps_appends_in_place() {
        let mut next = rng(9);
        let head: Vec<f32> = (0..50).map(|_| next()).collect();
        for mut a in [
            {
                let mut a = Aligned::copy(&head);
                a.reserve(1000);
                a
            },
            Aligned::copy_with_room(&head, 1000),
        ] {
            let mut want = head.clone();
            assert!(a.room() >= 1000);
            assert_eq!(a.values(), &want[..]);
            let at = a.values().as_ptr();
            assert_eq!(at as usize % 64, 0);
            while want.len() + 30 <= 1000 {
                let add: Vec<f32> = (0..30).map(|_| next()).collect();
                a.extend_from_slice(&add);
                want.extend_from_slice(&add);
                if want.len().is_multiple_of(7) {
                    a.truncate(want.len() - 3);
                    want.truncate(want.len() - 3);
                }
                assert_eq!(a.values().as_ptr(), at, "moved at {}", want.len());
                assert_eq!(a.values(), &want[..]);
            }
            // a clone is compact; reserving less than the room changes nothing
            assert_eq!(a.clone().values(), &want[..]);
            a.reserve(10);
            assert_eq!(a.values().as_ptr(), at);
            let more: Vec<f32> = (0..100).map(|_| next()).collect();
            a.extend_from_slice(&more);
            want.extend_from_slice(&more);
            assert_eq!(a.values(), &want[..]);
            assert_eq!(a.values().as_ptr() as usize % 64, 0);
        }
    }
}
