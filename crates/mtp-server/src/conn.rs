//! The connection loop: what a production server does before a request reaches a handler.
//!
//! `axum::serve` accepts every connection and waits on it for ever. Here each connection is
//! served by hyper's HTTP/1.1 with:
//! - a cap on open connections ([`ServerConfig::max_connections`]); beyond it a connection gets
//!   a 503 with `Retry-After` and is closed, so idle or slow clients cannot exhaust the file
//!   descriptors and `/health` keeps answering the clients it admits;
//! - a header timeout ([`ServerConfig::header_timeout`]): hyper starts it when the connection
//!   opens and again when an answer is done, so it bounds both a half-sent header and an idle
//!   keep-alive connection;
//! - a write timeout ([`ServerConfig::write_timeout`]): a write that makes no progress that long
//!   (a client that stopped reading a stream) ends the connection; the answer's stream is
//!   dropped with it, which cancels the generation and frees its slot;
//! - a shutdown deadline ([`ServerConfig::shutdown_grace`]): after the signal, new requests are
//!   answered 503 (and `/health` too) while the ones in flight finish; at the deadline the rest
//!   are cut.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
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

pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    state: Shared,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let open = Arc::new(Semaphore::new(config.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let graceful = GracefulShutdown::new();
    let mut tasks = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .keep_alive(true);
    let service = TowerToHyperService::new(app);
    let refusal = refusal_bytes(config.max_connections);
    tokio::pin!(shutdown);
    let mut deadline: Option<Instant> = None;
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
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    tracing::warn!(
                        in_flight = state.metrics.in_flight(),
                        "shutdown deadline reached: cutting the requests still in flight"
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
                let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
                    state.metrics.connection_refused();
                    refuse(tcp, &refusing, &refusal, &mut tasks);
                    continue;
                };
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY: {e}");
                }
                let mut io = TimeoutStream::new(tcp);
                io.set_write_timeout(Some(config.write_timeout));
                let conn = http.serve_connection(TokioIo::new(Box::pin(io)), service.clone());
                let conn = graceful.watch(conn);
                let gauge = state.metrics.connection_opened();
                tasks.spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, "connection ended: {e}");
                    }
                    drop(gauge);
                    drop(permit);
                });
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
        .clamp(Duration::from_millis(500), FLUSH_GRACE);
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
