//! A request's cancellation, from the moment it is accepted to its last byte.
//!
//! Whoever serves a request (the HTTP server, a CLI's Ctrl-C) holds its [`Cancel`] and calls
//! [`Cancel::cancel`] when the work is no longer wanted: the client went away, the server's
//! shutdown deadline passed. Every stage that works for the request (rendering, tokenizing,
//! decoding images, compiling a constraint, waiting in a queue, each part of a prefill, each
//! decode step) reads the same token and stops at its next check.
//!
//! Work that runs off the caller's task (a blocking thread, an engine's scheduler) holds a
//! [`Lease`] while it runs, so the caller can wait for it to have *really* stopped
//! ([`Cancel::idle`]) before it gives the request's slot to the next one: an abandoned
//! request never outlives its admission.
//!
//! ```
//! use mtp_contract::Cancel;
//!
//! let cancel = Cancel::new();
//! let lease = cancel.lease();
//! let worker = cancel.clone();
//! let t = std::thread::spawn(move || {
//!     let _lease = lease; // held while the work runs
//!     while worker.check().is_ok() {
//!         std::thread::yield_now();
//!     }
//! });
//! cancel.cancel();
//! t.join().unwrap();
//! assert!(cancel.is_cancelled() && cancel.is_idle());
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::ProviderError;

/// One request's cancellation token: cheap to clone, every clone the same token.
///
/// Two tokens always compare equal: who may cancel a request is not part of what it asks for
/// (a request's equality is its content's).
#[derive(Clone, Default)]
pub struct Cancel(Arc<Inner>);

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    work: Mutex<Work>,
}

#[derive(Default)]
struct Work {
    leases: usize,
    waiting: Vec<Waker>,
}

impl Cancel {
    /// A token not cancelled, with no work leased.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels the request (idempotent).
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
    }

    /// Whether the request was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// `Err(ProviderError::Cancelled)` once the request is cancelled: the check every stage
    /// makes before it starts and between its parts.
    pub fn check(&self) -> Result<(), ProviderError> {
        if self.is_cancelled() {
            Err(ProviderError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// A hold on the request by work running elsewhere (a blocking thread, a scheduler),
    /// released when dropped.
    pub fn lease(&self) -> Lease {
        self.work().leases += 1;
        Lease(self.clone())
    }

    /// Whether no work holds a lease now.
    pub fn is_idle(&self) -> bool {
        self.work().leases == 0
    }

    /// Resolves once no work holds a lease (at once if none does).
    pub fn idle(&self) -> Idle {
        Idle(self.clone())
    }

    fn work(&self) -> MutexGuard<'_, Work> {
        self.0.work.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PartialEq for Cancel {
    fn eq(&self, _: &Cancel) -> bool {
        true
    }
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .field("leases", &self.work().leases)
            .finish()
    }
}

/// Work's hold on a request (see [`Cancel::lease`]).
#[derive(Debug)]
pub struct Lease(Cancel);

impl Lease {
    /// The request's token.
    pub fn cancel(&self) -> &Cancel {
        &self.0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let wake = {
            let mut w = self.0.work();
            w.leases = w.leases.saturating_sub(1);
            if w.leases == 0 {
                std::mem::take(&mut w.waiting)
            } else {
                Vec::new()
            }
        };
        wake.into_iter().for_each(Waker::wake);
    }
}

/// The future of [`Cancel::idle`].
#[derive(Debug)]
pub struct Idle(Cancel);

impl Future for Idle {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut w = self.0.work();
        if w.leases == 0 {
            return Poll::Ready(());
        }
        if !w.waiting.iter().any(|k| k.will_wake(cx.waker())) {
            w.waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn idle_waits_for_every_lease() {
        let c = Cancel::new();
        assert!(c.is_idle());
        let (a, b) = (c.lease(), c.lease());
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(Arc::clone(&flag));
        let mut cx = Context::from_waker(&waker);
        let mut idle = c.idle();
        assert!(Pin::new(&mut idle).poll(&mut cx).is_pending());
        drop(a);
        assert!(!flag.0.load(Ordering::SeqCst), "one lease is still held");
        assert!(Pin::new(&mut idle).poll(&mut cx).is_pending());
        drop(b);
        assert!(
            flag.0.load(Ordering::SeqCst),
            "the last lease wakes the waiter"
        );
        assert!(Pin::new(&mut idle).poll(&mut cx).is_ready());
    }

    #[test]
    fn clones_share_one_state() {
        let c = Cancel::new();
        let d = c.clone();
        assert!(d.check().is_ok());
        c.cancel();
        assert!(matches!(d.check(), Err(ProviderError::Cancelled)));
        assert_eq!(c, Cancel::new(), "tokens compare equal");
    }
}
