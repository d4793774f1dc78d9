//! The worker team behind the decode kernels' parallel loops (the crate's `kernels` module). Public
//! for its size only ([`set_threads`], [`threads`]); the loops are the crate's own.
//!
//! A decode step runs a few hundred small parallel loops (one per matrix product, attention or
//! delta-rule call), each a few to a few hundred microseconds long, so what a loop costs to
//! start and to join matters as much as the work. A general-purpose pool called from outside
//! hands the loop to a worker and puts the caller to sleep until it is done: two thread
//! switches per loop. Here the calling thread takes part: it publishes the loop, claims chunks
//! from a shared counter like the workers do, and waits only for chunks a worker has already
//! started. A worker that was asleep costs the caller one wake-up call and nothing else (the
//! caller does not wait for it to arrive). Workers spin for a short while after each loop, so
//! that the next loop of the same step finds them awake, and then sleep.
//!
//! One caller at a time owns the team; a loop started while another caller holds it (two
//! requests decoding at once, or a loop inside a loop) runs on its own thread, in order. Which
//! thread runs a chunk never changes what the chunk computes.
//!
//! Size: [`set_threads`] before the first loop (the native provider's `threads` option, `mtp
//! --threads`), else `MTP_NUM_THREADS` (the threads that run a loop, the caller included) when
//! set, else
//! the machine's available parallelism.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a worker keeps looking for the next loop before it sleeps.
const SPIN: Duration = Duration::from_micros(1000);
/// Of that, how long it spins without giving its core away.
const HOT_SPIN: Duration = Duration::from_micros(50);
/// The environment variable that sets the team's size.
pub const THREADS_VAR: &str = "MTP_NUM_THREADS";

/// One published loop: `f(i)` for every `i < n`, each claimed once through `next`.
struct Job<'a> {
    /// Borrowed from the caller's frame, which outlives every use (see [`run`]).
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    panicked: AtomicBool,
    /// The caller's quantized-product arithmetic, which every thread taking part runs in.
    arith: crate::arith::Arith,
}

impl Job<'_> {
    /// Claims and runs chunks until none is left; a panicking chunk is recorded, not spread.
    fn work(&self) {
        crate::arith::with_arith(self.arith, || self.claim());
    }

    fn claim(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| (self.f)(i))).is_err() {
                self.panicked.store(true, SeqCst);
            }
        }
    }
}

struct Team {
    /// Worker threads running (the caller not counted); zero until they are started.
    workers: AtomicUsize,
    /// Held by the caller whose loop is published.
    owned: AtomicBool,
    /// The published loop, or null.
    /// (Its lifetime is the publishing caller's frame, not `'static`: see [`run`].)
    job: AtomicPtr<Job<'static>>,
    /// Bumped once per published loop; what idle workers watch.
    epoch: AtomicUsize,
    /// Workers between announcing themselves and leaving a loop: the caller returns only when
    /// this is zero after it has withdrawn its loop.
    active: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The size asked for by [`set_threads`] before the team started.
static REQUESTED: OnceLock<usize> = OnceLock::new();

/// Asks for `n` threads (the caller included) for every parallel loop of this process: the
/// team's size, and the GEMM's of prefill. Only the first call before the team starts counts
/// (it starts with the first parallel loop); returns the size in effect, which differs from
/// `n` when the team already runs.
pub fn set_threads(n: usize) -> usize {
    let _ = REQUESTED.set(n.max(1));
    threads()
}

/// The threads that run a parallel loop, the caller included.
pub fn threads() -> usize {
    team().workers.load(SeqCst) + 1
}

/// The team, its workers started on first use.
fn team() -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    TEAM.get_or_init(|| {
        let threads = REQUESTED.get().copied().unwrap_or_else(|| {
            std::env::var(THREADS_VAR)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|n| *n > 0)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        });
        let team: &'static Team = Box::leak(Box::new(Team {
            workers: AtomicUsize::new(0),
            owned: AtomicBool::new(false),
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        for i in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("mtp-worker-{i}"))
                .spawn(move || worker(team));
            if let Err(e) = spawned {
                tracing::warn!("could not start kernel worker thread {i}: {e}");
                break;
            }
            team.workers.fetch_add(1, SeqCst);
        }
        team
    })
}

fn worker(team: &'static Team) {
    let mut seen = team.epoch.load(SeqCst);
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        loop {
            let now = team.epoch.load(SeqCst);
            if now != seen {
                seen = now;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(32) {
                let idle = started.elapsed();
                if idle >= SPIN {
                    let mut guard = team.lock.lock().unwrap_or_else(|e| e.into_inner());
                    team.sleepers.fetch_add(1, SeqCst);
                    while team.epoch.load(SeqCst) == seen {
                        guard = team.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                    }
                    team.sleepers.fetch_sub(1, SeqCst);
                    seen = team.epoch.load(SeqCst);
                    break;
                }
                if idle >= HOT_SPIN {
                    std::thread::yield_now();
                    continue;
                }
            }
            std::hint::spin_loop();
        }
        // announce first, then look: a caller that has withdrawn its loop and then sees no
        // active worker knows that nobody can still be reading it
        team.active.fetch_add(1, SeqCst);
        let job = team.job.load(SeqCst);
        if !job.is_null() {
            // SAFETY: the caller that published `job` does not return (and its frame, which
            // holds the job, stays alive) until `active` is zero after the job is withdrawn;
            // this worker counts in `active` from before it loaded the pointer.
            unsafe { &*job }.work();
        }
        team.active.fetch_sub(1, SeqCst);
    }
}

/// Runs `f(i)` for every `i < n` exactly once, on the calling thread and the team's idle
/// workers, and returns when every call has returned. A panic in any call is raised again
/// here, after all calls are done.
pub(crate) fn run(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let team = team();
    let job = Job {
        f,
        n,
        next: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        arith: crate::arith::current(),
    };
    let shared = n >= 2
        && team.workers.load(SeqCst) > 0
        && team
            .owned
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_ok();
    if shared {
        // Workers use the job only between their `active` increment and decrement around a
        // load of `team.job`; below, the job is withdrawn and `active` awaited at zero before
        // this frame ends (`work` catches panicking calls, so nothing unwinds past that).
        let published = (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
        team.job.store(published, SeqCst);
        team.epoch.fetch_add(1, SeqCst);
        if team.sleepers.load(SeqCst) > 0 {
            // taken after the epoch moved: a worker going to sleep either sees the new epoch
            // or is already waiting when this notifies
            drop(team.lock.lock().unwrap_or_else(|e| e.into_inner()));
            team.wake.notify_all();
        }
    }
    job.work();
    if shared {
        team.job.store(std::ptr::null_mut(), SeqCst);
        let started = Instant::now();
        while team.active.load(SeqCst) != 0 {
            if started.elapsed() >= HOT_SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        team.owned.store(false, SeqCst);
    }
    if job.panicked.load(SeqCst) {
        resume_unwind(Box::new("a kernel loop panicked (see the message above)"));
    }
}

/// A pointer that may be shared because the chunks handed out through it are disjoint.
struct Shared<T>(*mut T);
// SAFETY: used only to hand disjoint chunks of one `&mut [T]` to [`run`]'s calls.
unsafe impl<T: Send> Sync for Shared<T> {}
impl<T> Shared<T> {
    fn at(&self, i: usize) -> *mut T {
        self.0.wrapping_add(i)
    }
}

/// `f(i, chunk)` for each `size`-element chunk of `data` (the last one may be shorter), in
/// parallel through [`run`].
///
/// # Panics
/// When `size` is zero.
pub(crate) fn chunks_mut<T: Send>(data: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    assert!(size > 0, "chunks_mut: chunks of zero elements");
    let len = data.len();
    let base = Shared(data.as_mut_ptr());
    run(len.div_ceil(size), &|i| {
        let start = i * size;
        let end = (start + size).min(len);
        // SAFETY: `run` calls each `i` once, so the chunks `[start, end)` handed out are
        // disjoint and inside `data`, which is borrowed mutably for the whole call.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.at(start), end - start) };
        f(i, chunk)
    });
}

/// A slice that [`chunks_mut3`] hands out in chunks of `size` elements.
pub(crate) struct Chunked<'a, T> {
    /// The elements.
    pub(crate) data: &'a mut [T],
    /// Elements per chunk.
    pub(crate) size: usize,
}

/// `f(i, a_chunk, b_chunk, c_chunk)` for `n` chunk triples: chunk `i` of each of `a`, `b`, `c`
/// (any may be short or empty past its end, however large `i * size`), in parallel through
/// [`run`].
pub(crate) fn chunks_mut3<A: Send, B: Send, C: Send>(
    n: usize,
    a: Chunked<'_, A>,
    b: Chunked<'_, B>,
    c: Chunked<'_, C>,
    f: impl Fn(usize, &mut [A], &mut [B], &mut [C]) + Sync,
) {
    let (
        Chunked { data: a, size: sa },
        Chunked { data: b, size: sb },
        Chunked { data: c, size: sc },
    ) = (a, b, c);
    let (la, lb, lc) = (a.len(), b.len(), c.len());
    let (pa, pb, pc) = (
        Shared(a.as_mut_ptr()),
        Shared(b.as_mut_ptr()),
        Shared(c.as_mut_ptr()),
    );
    run(n, &|i| {
        // saturating: a product past `usize::MAX` is past the slice's end (never wraps back into
        // another chunk's range)
        let range = |s: usize, len: usize| {
            let start = i.saturating_mul(s).min(len);
            (start, start.saturating_add(s).min(len))
        };
        let ((a0, a1), (b0, b1), (c0, c1)) = (range(sa, la), range(sb, lb), range(sc, lc));
        // SAFETY: as in `chunks_mut`: each `i` once, and chunk `i` of a slice is
        // `[i * s, (i + 1) * s)` clamped to its length, so the ranges are disjoint and inside the
        // borrowed slices.
        let (ca, cb, cc) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.at(a0), a1 - a0),
                std::slice::from_raw_parts_mut(pb.at(b0), b1 - b0),
                std::slice::from_raw_parts_mut(pc.at(c0), c1 - c0),
            )
        };
        f(i, ca, cb, cc)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                run(n, &|i| {
                    hits[i].fetch_add(1, SeqCst);
                });
            }
            assert!(hits.iter().all(|h| h.load(SeqCst) == 50), "n = {n}");
        }
    }

    #[test]
    fn chunks_cover_the_slice_disjointly() {
        let mut v = vec![0u32; 1001];
        chunks_mut(&mut v, 64, |i, c| {
            c.iter_mut().for_each(|x| *x += i as u32 + 1)
        });
        for (j, x) in v.iter().enumerate() {
            assert_eq!(*x, (j / 64) as u32 + 1);
        }
        let (mut a, mut b, mut c) = (vec![0u8; 10], vec![0u8; 3], Vec::<u8>::new());
        let (ka, kb, kc) = (
            Chunked {
                data: &mut a,
                size: 2,
            },
            Chunked {
                data: &mut b,
                size: 1,
            },
            Chunked {
                data: &mut c,
                size: 4,
            },
        );
        chunks_mut3(5, ka, kb, kc, |i, ca, cb, cc| {
            assert!(cc.is_empty());
            ca.fill(i as u8);
            cb.fill(i as u8);
        });
        assert_eq!(a, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(b, [0, 1, 2]);
    }

    #[test]
    fn concurrent_and_nested_callers_each_get_every_index() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        run(8, &|i| {
                            // a loop inside a loop runs on its own thread
                            run(3, &|j| {
                                sum.fetch_add(i * 3 + j, SeqCst);
                            });
                        });
                        assert_eq!(sum.load(SeqCst), (0..24).sum::<usize>());
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_call_is_raised_after_the_loop() {
        let done = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            run(64, &|i| {
                if i == 5 {
                    panic!("chunk 5");
                }
                done.fetch_add(1, SeqCst);
            })
        }));
        assert!(r.is_err());
        assert_eq!(done.load(SeqCst), 63);
        // the team is usable afterwards
        let sum = AtomicUsize::new(0);
        run(10, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 45);
    }
}
