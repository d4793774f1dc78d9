//! The HTTP side: routing, the Hub's responses, content with ranges and faults.

use std::collections::BTreeSet;
use std::future::IntoFuture;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::util::{percent_decode, percent_encode, query_flag, query_param, sha1_hex};
use crate::{Fault, File, Repo, Request, Shared};

/// The size of the chunks a body is sent in.
const CHUNK: usize = 64 * 1024;
/// How long a body cut by [`Fault::DropAfter`] waits before the cut, so that the bytes before it
/// leave the server's buffers first.
const FLUSH_BEFORE_CUT: Duration = Duration::from_millis(50);
/// The date of every repository's commit.
const DATE: &str = "2026-01-01T00:00:00.000Z";

pub(crate) async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    shutdown: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let app = Router::new().fallback(handle).with_state(shared);
    tokio::select! {
        _ = axum::serve(listener, app).into_future() => {}
        _ = shutdown => {}
    }
}

/// One request, with what every handler needs.
struct Ctx {
    shared: Arc<Shared>,
    head: bool,
    headers: HeaderMap,
    query: Option<String>,
    /// The path as received (still percent-encoded).
    raw_path: String,
}

impl Ctx {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let mut path = percent_decode(uri.path());
    if let Some(q) = uri.query() {
        path.push('?');
        path.push_str(q);
    }
    shared.record(Request {
        method: method.to_string(),
        path,
        range: text("range"),
        authorization: text("authorization"),
        user_agent: text("user-agent"),
    });
    let head = method == Method::HEAD;
    if !head && method != Method::GET {
        return plain_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let ctx = Ctx {
        shared,
        head,
        query: uri.query().map(str::to_string),
        raw_path: uri.path().to_string(),
        headers,
    };
    let segs: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let response = match segs.as_slice() {
        ["api", "models", rest @ ..] => api(&ctx, rest),
        ["cdn", sha256] => cdn(&ctx, sha256),
        _ => resolve(&ctx, &segs),
    };
    if head {
        // the headers of the GET, no body
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    response
}

/// The repository whose id is `segs[..k]` for the first `k` of `ks` that names one, or the id
/// of the first candidate when none does.
fn find_repo(ctx: &Ctx, segs: &[&str], ks: &[usize]) -> Result<(Arc<Repo>, usize), String> {
    let id = |k: usize| {
        segs[..k]
            .iter()
            .map(|s| percent_decode(s))
            .collect::<Vec<_>>()
            .join("/")
    };
    for &k in ks {
        if let Some(repo) = ctx.shared.repo(&id(k)) {
            return Ok((repo, k));
        }
    }
    Err(ks.first().map(|&k| id(k)).unwrap_or_default())
}

fn decoded_join(segs: &[&str]) -> String {
    segs.iter()
        .map(|s| percent_decode(s))
        .collect::<Vec<_>>()
        .join("/")
}

/// `/api/models/{repo_id}[/revision/{rev}]` and `/api/models/{repo_id}/tree/{rev}[/{path}]`.
fn api(ctx: &Ctx, rest: &[&str]) -> Response {
    let mut ks: Vec<usize> = [2, 1]
        .into_iter()
        .filter(|&k| rest.len() > k && matches!(rest[k], "revision" | "tree"))
        .collect();
    if (1..=2).contains(&rest.len()) && !rest.iter().any(|s| s.is_empty()) {
        ks.push(rest.len());
    }
    if ks.is_empty() {
        return plain_error(StatusCode::NOT_FOUND, "Not Found");
    }
    let (repo, k) = match find_repo(ctx, rest, &ks) {
        Ok(found) => found,
        Err(_) => return repo_not_found(ctx),
    };
    match &rest[k..] {
        [] => info(
            ctx,
            &repo,
            &repo.branches.first().cloned().unwrap_or_default(),
        ),
        ["revision", rev @ ..] if !rev.is_empty() => info(ctx, &repo, &decoded_join(rev)),
        ["tree", rev, path @ ..] => tree(ctx, &repo, &percent_decode(rev), &decoded_join(path)),
        _ => plain_error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// The repository's metadata (`model_info`).
fn info(ctx: &Ctx, repo: &Repo, rev: &str) -> Response {
    let Some(commit) = repo.resolve(rev) else {
        return revision_not_found(rev);
    };
    let blobs = query_flag(ctx.query(), "blobs");
    let siblings: Vec<Value> = repo
        .files
        .iter()
        .map(|f| {
            let mut s = json!({ "rfilename": f.path });
            if blobs {
                s["blobId"] = json!(f.blob_id);
                s["size"] = json!(f.bytes.len());
                if f.lfs {
                    s["lfs"] = json!({
                        "sha256": f.sha256,
                        "size": f.bytes.len(),
                        "pointerSize": f.pointer_size,
                    });
                }
            }
            s
        })
        .collect();
    let used: usize = repo.files.iter().map(|f| f.bytes.len()).sum();
    let mut body = json!({
        "_id": &sha1_hex(format!("model:{}", repo.id).as_bytes())[..24],
        "id": repo.id,
        "modelId": repo.id,
    });
    if let Some((author, _)) = repo.id.split_once('/') {
        body["author"] = json!(author);
    }
    for (key, value) in [
        ("sha", json!(commit)),
        ("createdAt", json!(DATE)),
        ("lastModified", json!(DATE)),
        ("private", json!(false)),
        (
            "gated",
            if repo.gated_token.is_some() {
                json!("manual")
            } else {
                json!(false)
            },
        ),
        ("disabled", json!(false)),
        ("downloads", json!(0)),
        ("likes", json!(0)),
        ("tags", json!([])),
        ("siblings", json!(siblings)),
        ("usedStorage", json!(used)),
    ] {
        body[key] = value;
    }
    let mut r = json_response(StatusCode::OK, &body);
    set(&mut r, "x-repo-commit", commit);
    r
}

/// One page of the file listing (`list_repo_tree`).
fn tree(ctx: &Ctx, repo: &Repo, rev: &str, path: &str) -> Response {
    let Some(commit) = repo.resolve(rev) else {
        return revision_not_found(rev);
    };
    let prefix = path.trim_matches('/');
    let mut dirs = BTreeSet::new();
    for f in &repo.files {
        let mut p = f.path.as_str();
        while let Some((parent, _)) = p.rsplit_once('/') {
            dirs.insert(parent);
            p = parent;
        }
    }
    if !prefix.is_empty() && !dirs.contains(prefix) {
        return entry_not_found(Some(commit));
    }
    let recursive = query_flag(ctx.query(), "recursive");
    let expand = query_flag(ctx.query(), "expand");
    let listed = |p: &str| {
        let rest = if prefix.is_empty() {
            Some(p)
        } else {
            p.strip_prefix(prefix).and_then(|r| r.strip_prefix('/'))
        };
        rest.is_some_and(|r| recursive || !r.contains('/'))
    };
    let mut entries: Vec<(String, Value)> = Vec::new();
    for d in dirs.into_iter().filter(|d| listed(d)) {
        let oid = sha1_hex(format!("tree\0{commit}\0{d}").as_bytes());
        entries.push((
            d.to_string(),
            json!({ "type": "directory", "oid": oid, "size": 0, "path": d }),
        ));
    }
    for f in repo.files.iter().filter(|f| listed(&f.path)) {
        let mut e = json!({
            "type": "file",
            "oid": f.blob_id,
            "size": f.bytes.len(),
            "path": f.path,
        });
        if f.lfs {
            e["lfs"] = json!({
                "oid": f.sha256,
                "size": f.bytes.len(),
                "pointerSize": f.pointer_size,
            });
        }
        if expand {
            e["lastCommit"] = json!({ "id": commit, "title": "Upload files", "date": DATE });
        }
        entries.push((f.path.clone(), e));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));

    let start = match query_param(ctx.query(), "cursor") {
        None => 0,
        Some(c) => match c.parse::<usize>() {
            Ok(n) => n.min(entries.len()),
            Err(_) => return hub_error(StatusCode::BAD_REQUEST, None, "Invalid cursor"),
        },
    };
    let page_size = ctx.shared.page_size.load(Ordering::SeqCst).max(1);
    let end = (start + page_size).min(entries.len());
    let page: Vec<Value> = entries[start..end].iter().map(|e| e.1.clone()).collect();
    let mut r = json_response(StatusCode::OK, &json!(page));
    if end < entries.len() {
        let mut params: Vec<String> = ctx
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty() && p.split('=').next() != Some("cursor"))
            .map(str::to_string)
            .collect();
        params.push(format!("cursor={end}"));
        let next = format!(
            "<{}{}?{}>; rel=\"next\"",
            ctx.shared.base,
            ctx.raw_path,
            params.join("&")
        );
        set(&mut r, "link", &next);
    }
    r
}

/// `/{repo_id}/resolve/{rev}/{path}`: a small file's content, or an LFS file's redirect.
fn resolve(ctx: &Ctx, segs: &[&str]) -> Response {
    let ks: Vec<usize> = [2, 1]
        .into_iter()
        .filter(|&k| segs.len() >= k + 3 && segs[k] == "resolve")
        .collect();
    if ks.is_empty() {
        return plain_error(StatusCode::NOT_FOUND, "Not Found");
    }
    let (repo, k) = match find_repo(ctx, segs, &ks) {
        Ok(found) => found,
        Err(_) => return repo_not_found(ctx),
    };
    let rev = percent_decode(segs[k + 1]);
    let path = decoded_join(&segs[k + 2..]);
    // the model card of a gated repository is public
    if path != "README.md" {
        if let Some(refused) = gate(ctx, &repo) {
            return refused;
        }
    }
    let Some(commit) = repo.resolve(&rev) else {
        return revision_not_found(&rev);
    };
    let Some(file) = repo.file(&path) else {
        return entry_not_found(Some(commit));
    };
    if !file.lfs {
        return content(ctx, &repo, file, &file.blob_id);
    }
    let location = format!(
        "{}/cdn/{}?repo={}&file={}",
        ctx.shared.base,
        file.sha256,
        percent_encode(&repo.id),
        percent_encode(&file.path)
    );
    let text = format!("Found. Redirecting to {location}");
    let mut r = Response::new(Body::from(text.clone()));
    *r.status_mut() = StatusCode::FOUND;
    for (name, value) in [
        ("content-type", "text/plain; charset=utf-8".to_string()),
        ("content-length", text.len().to_string()),
        ("location", location),
        ("x-repo-commit", commit.to_string()),
        ("etag", format!("\"{}\"", file.blob_id)),
        ("x-linked-etag", format!("\"{}\"", file.sha256)),
        ("x-linked-size", file.bytes.len().to_string()),
        ("accept-ranges", "bytes".to_string()),
    ] {
        set(&mut r, name, &value);
    }
    r
}

/// `/cdn/{sha256}?repo=…&file=…`: an LFS file's content, where `resolve` redirects.
fn cdn(ctx: &Ctx, sha256: &str) -> Response {
    let repo_id = query_param(ctx.query(), "repo");
    let path = query_param(ctx.query(), "file");
    let repos: Vec<Arc<Repo>> = match repo_id.as_deref().and_then(|id| ctx.shared.repo(id)) {
        Some(repo) => vec![repo],
        None => ctx.shared.repos(),
    };
    let found = repos.iter().find_map(|repo| {
        let named = repo
            .files
            .iter()
            .find(|f| f.sha256 == sha256 && Some(&f.path) == path.as_ref());
        named
            .or_else(|| repo.files.iter().find(|f| f.sha256 == sha256))
            .map(|f| (repo, f))
    });
    match found {
        Some((repo, file)) => content(ctx, repo, file, &file.sha256),
        None => plain_error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// What a `Range` header asks of a body of `total` bytes.
#[derive(Debug, PartialEq, Eq)]
enum Range {
    Whole,
    /// First and last byte, inclusive.
    Part(usize, usize),
    Unsatisfiable,
}

/// A single `bytes=` range; anything else is ignored (the whole body), as RFC 9110 allows.
fn parse_range(header: Option<&str>, total: usize) -> Range {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Range::Whole;
    };
    if spec.contains(',') {
        return Range::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Range::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        return match last.parse::<usize>() {
            Ok(0) => Range::Unsatisfiable,
            Ok(_) if total == 0 => Range::Unsatisfiable,
            Ok(n) => Range::Part(total - n.min(total), total - 1),
            Err(_) => Range::Whole,
        };
    }
    let Ok(first) = first.parse::<usize>() else {
        return Range::Whole;
    };
    let last = if last.is_empty() {
        None
    } else {
        match last.parse::<usize>() {
            Ok(l) if l >= first => Some(l),
            _ => return Range::Whole,
        }
    };
    if first >= total {
        return Range::Unsatisfiable;
    }
    Range::Part(first, last.map_or(total - 1, |l| l.min(total - 1)))
}

/// A file's content (`200`, `206` or `416`), with the fault queued for it.
fn content(ctx: &Ctx, repo: &Repo, file: &File, etag: &str) -> Response {
    let fault = if ctx.head {
        None
    } else {
        ctx.shared.take_fault(&repo.id, &file.path)
    };
    if let Some(Fault::Status(code)) = fault {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let reason = status.canonical_reason().unwrap_or("Error");
        return plain_error(status, reason);
    }
    let range = match fault {
        Some(Fault::IgnoreRange) => None,
        _ => ctx.header("range"),
    };
    let total = file.bytes.len();
    let (status, start, end) = match parse_range(range, total) {
        Range::Whole => (StatusCode::OK, 0, total),
        Range::Part(first, last) => (StatusCode::PARTIAL_CONTENT, first, last + 1),
        Range::Unsatisfiable => {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            set(&mut r, "content-range", &format!("bytes */{total}"));
            set(&mut r, "content-length", "0");
            set(&mut r, "x-repo-commit", &repo.commit);
            return r;
        }
    };
    let body = if ctx.head {
        Body::empty()
    } else {
        body(ctx, repo, file, file.bytes.slice(start..end), fault)
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    for (name, value) in [
        ("content-type", "application/octet-stream".to_string()),
        ("content-length", (end - start).to_string()),
        ("accept-ranges", "bytes".to_string()),
        ("etag", format!("\"{etag}\"")),
        ("x-repo-commit", repo.commit.clone()),
    ] {
        set(&mut r, name, &value);
    }
    if status == StatusCode::PARTIAL_CONTENT {
        set(
            &mut r,
            "content-range",
            &format!("bytes {start}-{}/{total}", end - 1),
        );
    }
    r
}

/// A streamed body: `data` in chunks, each counted as sent, and the cut or stall of a fault.
fn body(ctx: &Ctx, repo: &Repo, file: &File, data: Bytes, fault: Option<Fault>) -> Body {
    let len = data.len();
    let at = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let (data, cut, tail) = match fault {
        Some(Fault::DropAfter(n)) if at(n) < len => (data, at(n), Some(FLUSH_BEFORE_CUT)),
        Some(Fault::StallAfter(n, wait)) if at(n) < len => (data, at(n), Some(wait)),
        Some(Fault::Corrupt) if len > 0 => {
            let mut bad = data.to_vec();
            bad[len / 2] ^= 0xff;
            (Bytes::from(bad), len, None)
        }
        _ => (data, len, None),
    };
    let sending = Sending {
        shared: Arc::clone(&ctx.shared),
        repo: repo.id.clone(),
        path: file.path.clone(),
        data,
        pos: 0,
        cut,
        tail,
    };
    Body::from_stream(futures::stream::unfold(sending, |mut s| async move {
        if s.pos < s.cut {
            let n = CHUNK.min(s.cut - s.pos);
            let chunk = s.data.slice(s.pos..s.pos + n);
            s.pos += n;
            s.shared.count_body(&s.repo, &s.path, n as u64);
            return Some((Ok(chunk), s));
        }
        let wait = s.tail.take()?;
        tokio::time::sleep(wait).await;
        let cut = std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "mtp-fakehub: connection cut by an injected fault",
        );
        Some((Err(cut), s))
    }))
}

struct Sending {
    shared: Arc<Shared>,
    repo: String,
    path: String,
    data: Bytes,
    pos: usize,
    /// Bytes sent before the end (or the cut).
    cut: usize,
    /// `Some(wait)`: after `cut` bytes, wait this long, then cut the connection.
    tail: Option<Duration>,
}

/// `None` when the request may read the gated repository's files, the Hub's refusal otherwise.
fn gate(ctx: &Ctx, repo: &Repo) -> Option<Response> {
    let token = repo.gated_token.as_deref()?;
    let id = &repo.id;
    match ctx.header("authorization") {
        Some(v) if v.strip_prefix("Bearer ").map(str::trim) == Some(token) => None,
        Some(_) => Some(hub_error(
            StatusCode::FORBIDDEN,
            Some("GatedRepo"),
            &format!(
                "Access to model {id} is restricted and you are not in the authorized list. \
                 Visit {}/{id} to ask for access.",
                ctx.shared.base
            ),
        )),
        None => Some(hub_error(
            StatusCode::UNAUTHORIZED,
            Some("GatedRepo"),
            &format!(
                "Access to model {id} is restricted. You must have access to it and be \
                 authenticated to access it. Please log in."
            ),
        )),
    }
}

/// The Hub answers an unknown repository `401` to an anonymous request (as it does a private
/// one) and `404` to an authenticated one.
fn repo_not_found(ctx: &Ctx) -> Response {
    let status = if ctx.header("authorization").is_some() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::UNAUTHORIZED
    };
    hub_error(status, Some("RepoNotFound"), "Repository not found")
}

fn revision_not_found(rev: &str) -> Response {
    hub_error(
        StatusCode::NOT_FOUND,
        Some("RevisionNotFound"),
        &format!("Invalid rev id: {rev}"),
    )
}

fn entry_not_found(commit: Option<&str>) -> Response {
    let mut r = hub_error(
        StatusCode::NOT_FOUND,
        Some("EntryNotFound"),
        "Entry not found",
    );
    if let Some(commit) = commit {
        set(&mut r, "x-repo-commit", commit);
    }
    r
}

/// An error as the Hub sends it: `X-Error-Code`, `X-Error-Message` and `{"error": message}`.
fn hub_error(status: StatusCode, code: Option<&str>, message: &str) -> Response {
    let mut r = json_response(status, &json!({ "error": message }));
    if let Some(code) = code {
        set(&mut r, "x-error-code", code);
    }
    set(&mut r, "x-error-message", message);
    r
}

fn plain_error(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({ "error": message }))
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    let text = value.to_string();
    let len = text.len();
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    set(&mut r, "content-type", "application/json; charset=utf-8");
    set(&mut r, "content-length", &len.to_string());
    r
}

/// Sets a header; characters a header cannot carry become `?`.
fn set(r: &mut Response, name: &'static str, value: &str) {
    let value = HeaderValue::from_str(value).unwrap_or_else(|_| {
        let clean: String = value
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        HeaderValue::from_str(&clean).unwrap_or(HeaderValue::from_static("?"))
    });
    r.headers_mut().insert(HeaderName::from_static(name), value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_rfc_9110_reads_them() {
        assert_eq!(parse_range(None, 10), Range::Whole);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Range::Part(0, 3));
        assert_eq!(parse_range(Some("bytes=4-"), 10), Range::Part(4, 9));
        assert_eq!(parse_range(Some("bytes=4-100"), 10), Range::Part(4, 9));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Range::Part(7, 9));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Range::Part(0, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=5-2"), 10), Range::Whole);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Range::Whole);
        assert_eq!(parse_range(Some("items=0-1"), 10), Range::Whole);
    }
}
