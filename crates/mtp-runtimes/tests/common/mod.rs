//! Local servers for the contract tests: an axum server that replays recorded response
//! shapes (and logs what it received), and a raw TCP server for transport faults that a
//! well-behaved HTTP framework cannot produce.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use mtp_contract::{GenerateRequest, GenerateResponse, Provider, ProviderError, StreamEvent};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Collects a stream: the deltas' text, the final response, and a trailing error if any.
pub async fn collect(
    p: &Arc<dyn Provider>,
    r: GenerateRequest,
) -> (String, Option<GenerateResponse>, Option<ProviderError>) {
    let mut s = p.generate_stream(r).await.expect("stream starts");
    let mut text = String::new();
    let mut done = None;
    let mut err = None;
    while let Some(item) = s.next().await {
        match item {
            Ok(StreamEvent::Delta { text: t, .. }) => text.push_str(&t),
            // (the calls are checked on the final response)
            Ok(StreamEvent::ToolCall(_) | StreamEvent::PromptProgress(_)) => {}
            Ok(StreamEvent::Done(r)) => done = Some(*r),
            Err(e) => err = Some(e),
        }
    }
    (text, done, err)
}

/// A recorded fixture file.
pub fn fixture(rel: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// One canned answer.
#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Serve the body in pieces of this many bytes (to split SSE events anywhere).
    pub piece: Option<usize>,
    /// After `body`, this chunk again and again: `count` times, or forever when `None`.
    /// Made lazily, so the server holds one chunk however much it sends.
    pub repeat: Option<(Bytes, Option<usize>)>,
}

impl Reply {
    pub fn json(rel: &str) -> Reply {
        Reply {
            status: 200,
            content_type: "application/json",
            body: fixture(rel),
            piece: None,
            repeat: None,
        }
    }
    pub fn sse(rel: &str, piece: usize) -> Reply {
        Reply {
            status: 200,
            content_type: "text/event-stream",
            body: fixture(rel),
            piece: Some(piece),
            repeat: None,
        }
    }
    pub fn text(rel: &str) -> Reply {
        Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4",
            body: fixture(rel),
            piece: None,
            repeat: None,
        }
    }
    pub fn status(status: u16, content_type: &'static str, body: &[u8]) -> Reply {
        Reply {
            status,
            content_type,
            body: body.to_vec(),
            piece: None,
            repeat: None,
        }
    }
    /// `head`, then `chunk` repeated `count` times (forever when `None`), streamed without a
    /// length: a body as long as a test needs that the server never holds whole.
    pub fn endless(
        status: u16,
        content_type: &'static str,
        head: &[u8],
        chunk: Vec<u8>,
        count: Option<usize>,
    ) -> Reply {
        Reply {
            status,
            content_type,
            body: head.to_vec(),
            piece: None,
            repeat: Some((Bytes::from(chunk), count)),
        }
    }
}

/// What the mock received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub auth: Option<String>,
    pub body: Value,
}

#[derive(Default)]
struct MockState {
    routes: HashMap<String, (Vec<Reply>, usize)>,
    log: Vec<Seen>,
}

/// A replaying HTTP server on 127.0.0.1.
pub struct Mock {
    pub base: String,
    state: Arc<Mutex<MockState>>,
}

impl Mock {
    /// Routes are `"GET /props"`-style keys; several replies are served in order, the last
    /// one repeating. Unknown routes answer 404.
    pub async fn start(routes: Vec<(&str, Vec<Reply>)>) -> Mock {
        let mut st = MockState::default();
        for (k, v) in routes {
            st.routes.insert(k.to_string(), (v, 0));
        }
        let state = Arc::new(Mutex::new(st));
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Mock {
            base: format!("http://{addr}"),
            state,
        }
    }

    pub fn log(&self) -> Vec<Seen> {
        self.state.lock().expect("lock").log.clone()
    }

    /// The JSON bodies of POSTs received.
    pub fn posts(&self) -> Vec<Seen> {
        self.log()
            .into_iter()
            .filter(|s| s.method == "POST")
            .collect()
    }
}

async fn handle(
    State(state): State<Arc<Mutex<MockState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = format!("{} {}", method, uri.path());
    let reply = {
        let mut st = state.lock().expect("lock");
        st.log.push(Seen {
            method: method.to_string(),
            path: uri.path().to_string(),
            auth: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
        match st.routes.get_mut(&key) {
            Some((replies, next)) => {
                let r = replies[(*next).min(replies.len() - 1)].clone();
                *next += 1;
                Some(r)
            }
            None => None,
        }
    };
    let Some(r) = reply else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("content-type", "application/json")
            .body(Body::from(
                r#"{"error":{"message":"File Not Found","type":"not_found_error","code":404}}"#,
            ))
            .expect("response");
    };
    let body = match (r.piece, r.repeat) {
        (_, Some((chunk, count))) => {
            use futures::StreamExt;
            // `Bytes` clones share one buffer: the server holds one chunk
            let head = futures::stream::once(async move { Bytes::from(r.body) });
            let tail = futures::stream::repeat(chunk).take(count.unwrap_or(usize::MAX));
            Body::from_stream(head.chain(tail).map(Ok::<_, Infallible>))
        }
        (Some(n), None) => {
            let pieces: Vec<Result<Vec<u8>, Infallible>> =
                r.body.chunks(n.max(1)).map(|c| Ok(c.to_vec())).collect();
            Body::from_stream(futures::stream::iter(pieces))
        }
        (None, None) => Body::from(r.body),
    };
    Response::builder()
        .status(StatusCode::from_u16(r.status).expect("status"))
        .header("content-type", r.content_type)
        .body(body)
        .expect("response")
}

/// A transport fault to stage on the raw server, for the one POST path it serves.
#[derive(Clone)]
pub enum Fault {
    /// Event-stream headers without a length, these bytes, then close (a clean EOF).
    CloseAfter(Vec<u8>),
    /// Chunked event-stream headers, these bytes as one chunk, then close mid-encoding.
    ChunkedCut(Vec<u8>),
    /// Headers (with the given content type), these bytes, then silence for 10 s.
    Stall(&'static str, Vec<u8>),
    /// Read the request and never answer.
    NoHeaders,
    /// Event-stream headers and these bytes, then report when the client hangs up.
    WatchClose(Vec<u8>),
}

/// A raw TCP server staging `fault` on every POST; other requests get an empty 404. The
/// receiver gets a message when a `WatchClose` client hangs up.
pub async fn raw_server(fault: Fault) -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let fault = fault.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                serve_raw(sock, fault, tx).await;
            });
        }
    });
    (format!("http://{addr}"), rx)
}

async fn read_request(sock: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())
                        .flatten()
                })
                .unwrap_or(0);
            let mut have = buf.len() - (end + 4);
            while have < len {
                let n = sock.read(&mut tmp).await.ok()?;
                if n == 0 {
                    return None;
                }
                have += n;
            }
            return Some(head);
        }
    }
}

async fn serve_raw(mut sock: TcpStream, fault: Fault, tx: tokio::sync::mpsc::UnboundedSender<()>) {
    loop {
        let Some(head) = read_request(&mut sock).await else {
            return;
        };
        if !head.starts_with("POST ") {
            let _ = sock
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await;
            continue;
        }
        let sse_head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
        match fault {
            Fault::CloseAfter(bytes) => {
                let _ = sock.write_all(sse_head).await;
                let _ = sock.write_all(&bytes).await;
                let _ = sock.shutdown().await;
            }
            Fault::ChunkedCut(bytes) => {
                let _ = sock
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await;
                let _ = sock
                    .write_all(format!("{:x}\r\n", bytes.len()).as_bytes())
                    .await;
                let _ = sock.write_all(&bytes).await;
                let _ = sock.write_all(b"\r\n").await;
                let _ = sock.flush().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                // drop mid-encoding: no terminating zero-length chunk
            }
            Fault::Stall(ct, bytes) => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ncontent-length: 100000\r\n\r\n"
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&bytes).await;
                let _ = sock.flush().await;
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Fault::NoHeaders => {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Fault::WatchClose(bytes) => {
                let _ = sock.write_all(sse_head).await;
                let _ = sock.write_all(&bytes).await;
                let _ = sock.flush().await;
                let mut tmp = [0u8; 64];
                loop {
                    match tokio::time::timeout(Duration::from_secs(10), sock.read(&mut tmp)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => {
                            let _ = tx.send(());
                            break;
                        }
                        Ok(Ok(_)) => continue,
                        Err(_) => break,
                    }
                }
            }
        }
        return;
    }
}

/// A port on which nothing listens.
pub async fn refused_base() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}
