//! The connection loop: what a production server does before a request reaches a handler.
//!
//! `axum::serve` accepts every connection and waits on it for ever. Here each connection is
//! served by hyper's HTTP/1.1 with:
//! - a cap on open connections ([`ServerConfig::max_connections`]); at the cap a new connection
//!   takes the place of the longest-idle one that has no request in flight (never sent a
//!   request, or between keep-alive requests: nginx drains idle keep-alive connections the same
//!   way), so idle sockets cannot lock real clients out; when every open connection has a
//!   request in flight, the new one gets a 503 with `Retry-After` and is closed;
//! - a header timeout ([`ServerConfig::header_timeout`]): hyper starts it when the connection
//!   opens and again when an answer is done, so it bounds both a half-sent header and an idle
//!   keep-alive connection;
//! - a write timeout ([`ServerConfig::write_timeout`]): a write that makes no progress that long
//!   (a client that stopped reading a stream) ends the connection; the answer's stream is
//!   dropped with it, which cancels the generation and frees its slot;
//! - a shutdown deadline ([`ServerConfig::shutdown_grace`]): after the signal, new requests are
//!   answered 503 (and `/health` too) while the ones in flight finish; shortly before the
//!   deadline the rest are cancelled (their work stops at its next check), and at the deadline
//!   every connection is cut.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tokio_io_timeout::TimeoutStream;

use crate::{ServerConfig, ServerError, Shared};

/// Connections being refused at once (each is answered and closed within a second or two);
/// past this a refused connection is closed without an answer.
const REFUSING_AT_ONCE: usize = 64;
/// How long a refused connection gets to take its 503.
const REFUSAL_WRITE: Duration = Duration::from_secs(2);
/// The most a connection gets to write out its last answer once no request is running.
const FLUSH_GRACE: Duration = Duration::from_secs(2);
/// How often a draining server looks whether the requests in flight are done.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// How long before the shutdown deadline the requests still in flight are cancelled (at most
/// a quarter of the grace): their work stops at its next check and their answers end.
const CANCEL_LEAD: Duration = Duration::from_secs(1);

/// What the accept loop knows of one open connection: its slot under the cap, how many of its
/// requests are in flight (from the handler's start to its answer's last byte), and since
/// when it has had none.
///
/// The slot lives here, not in the connection's task, so that evicting the connection hands
/// the slot itself to the newcomer: no other connection can take it in between.
struct ConnState {
    slot: Mutex<Option<OwnedSemaphorePermit>>,
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl ConnState {
    fn new(slot: OwnedSemaphorePermit) -> Arc<ConnState> {
        Arc::new(ConnState {
            slot: Mutex::new(Some(slot)),
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    fn idle_since(&self) -> Option<Instant> {
        let since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        (self.busy.load(Ordering::Acquire) == 0).then_some(since)
    }

    fn take_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// A connection's task's hold on its entry: when the task ends or is dropped, the entry goes
/// and the slot (unless an eviction took it) is freed.
struct Leave {
    open: Open,
    key: u64,
    state: Arc<ConnState>,
}

impl Drop for Leave {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
        drop(self.state.take_slot());
    }
}

/// One request in flight on a connection, until dropped with its answer's body.
struct InFlight(Arc<ConnState>);

impl InFlight {
    fn new(conn: &Arc<ConnState>) -> InFlight {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(conn))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request counted as in flight until it is sent or dropped.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The open connections, by number: their state and how to close one (set once its task is
/// spawned; the entry is made before, so a task that ends at once never leaves one behind).
type Open = Arc<Mutex<HashMap<u64, (Arc<ConnState>, Option<AbortHandle>)>>>;

/// Closes the longest-idle connection that has no request in flight, if any, and returns its
/// slot for the connection that takes its place.
fn evict_idle(open: &Open) -> Option<OwnedSemaphorePermit> {
    let mut conns = open.lock().unwrap_or_else(|p| p.into_inner());
    let (_, key) = conns
        .iter()
        .filter_map(|(k, (c, a))| {
            a.as_ref().filter(|a| !a.is_finished())?;
            Some((c.idle_since()?, *k))
        })
        .min()?;
    let (state, abort) = conns.remove(&key)?;
    let slot = state.take_slot();
    if let Some(a) = abort {
        a.abort();
    }
    slot
}

pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    state: Shared,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let open: Open = Arc::default();
    let mut next_conn = 0u64;
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let graceful = GracefulShutdown::new();
    let mut tasks = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .keep_alive(true);
    let refusal = refusal_bytes(config.max_connections);
    tokio::pin!(shutdown);
    let mut deadline: Option<Instant> = None;
    let mut cancelled = false;
    loop {
        while tasks.try_join_next().is_some() {}
        tokio::select! {
            () = &mut shutdown, if deadline.is_none() => {
                state.shutting_down.store(true, Ordering::SeqCst);
                deadline = Some(Instant::now() + config.shutdown_grace);
                tracing::info!(
                    grace_s = config.shutdown_grace.as_secs_f64(),
                    "shutting down: finishing the requests in flight"
                );
            }
            () = tokio::time::sleep(DRAIN_POLL), if deadline.is_some() => {
                if state.metrics.in_flight() == 0 {
                    break;
                }
                let Some(d) = deadline else { continue };
                let now = Instant::now();
                let lead = CANCEL_LEAD.min(config.shutdown_grace / 4);
                if !cancelled && now + lead >= d {
                    cancelled = true;
                    let n = state.cancel_all();
                    tracing::warn!(
                        requests = n,
                        "shutdown deadline near: cancelling the requests still in flight"
                    );
                }
                if now >= d {
                    tracing::warn!(
                        in_flight = state.metrics.in_flight(),
                        "shutdown deadline reached: cutting the connections still open"
                    );
                    break;
                }
            }
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        if !is_connection_error(&e) {
                            // out of file descriptors, most likely: wait for some to close
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        continue;
                    }
                };
                // a slot now, or the slot of the longest-idle connection, closed for it
                let slot = match Arc::clone(&slots).try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => match evict_idle(&open) {
                        Some(p) => {
                            state.metrics.connection_evicted();
                            p
                        }
                        None => {
                            state.metrics.connection_refused();
                            refuse(tcp, &refusing, &refusal, &mut tasks);
                            continue;
                        }
                    },
                };
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY: {e}");
                }
                let mut io = TimeoutStream::new(tcp);
                io.set_write_timeout(Some(config.write_timeout));
                let conn_state = ConnState::new(slot);
                let service = {
                    let (router, conn_state) = (TowerToHyperService::new(app.clone()), Arc::clone(&conn_state));
                    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let in_flight = InFlight::new(&conn_state);
                        let answer = router.call(req);
                        async move {
                            let res = answer.await?;
                            Ok::<_, std::convert::Infallible>(res.map(|body| {
                                Body::new(Tracked { body, _in_flight: in_flight })
                            }))
                        }
                    })
                };
                let conn = http.serve_connection(TokioIo::new(Box::pin(io)), service);
                let conn = graceful.watch(conn);
                let gauge = state.metrics.connection_opened();
                let key = next_conn;
                next_conn += 1;
                let leave = Leave {
                    open: Arc::clone(&open),
                    key,
                    state: Arc::clone(&conn_state),
                };
                open.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, (conn_state, None));
                let abort = tasks.spawn(async move {
                    let _leave = leave;
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, "connection ended: {e}");
                    }
                    drop(gauge);
                });
                if let Some(entry) = open.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&key) {
                    entry.1 = Some(abort);
                }
            }
        }
    }
    drop(listener);
    // No request is running now (or the deadline has passed): idle keep-alive connections
    // close at once, an answer still being written gets a moment to go out, and a request
    // still being sent is cut.
    let left = deadline
        .map(|d| d.saturating_duration_since(Instant::now()))
        .unwrap_or_default()
        .clamp(Duration::from_millis(100), FLUSH_GRACE);
    if tokio::time::timeout(left, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open at the deadline were closed");
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Errors of one connection that say nothing about the listener (as hyper's examples and
/// axum::serve treat them).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// The whole answer a connection over the cap gets.
fn refusal_bytes(max: usize) -> Arc<[u8]> {
    let body = serde_json::to_string(&crate::ApiError::too_many_connections(max).body())
        .unwrap_or_else(|_| "{}".into());
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .into()
}

/// Answers a connection over the cap with a 503 and closes it, in the background and bounded
/// in time; when too many are being refused already, closes it at once.
fn refuse(
    mut tcp: TcpStream,
    refusing: &Arc<Semaphore>,
    answer: &Arc<[u8]>,
    tasks: &mut JoinSet<()>,
) {
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else {
        return;
    };
    let answer = Arc::clone(answer);
    tasks.spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_WRITE, async {
            tcp.write_all(&answer).await?;
            tcp.shutdown().await?;
            // read what the client sent, so that closing does not reset the connection
            // before it reads the answer
            let mut sink = [0u8; 4096];
            while tcp.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
        drop(permit);
    });
}
