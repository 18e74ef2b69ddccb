//! A webhook receiver for `--sink http` tests: a real HTTP server (axum on its own runtime thread)
//! on a free 127.0.0.1 port that records every request (path, headers, body, the status it was
//! answered with) and, given the signing secret, verifies `Outboxd-Signature` by recomputing the
//! HMAC-SHA256 of the v2 signature base (`<t>`, the path, the signed headers, the body), or of
//! `"<t>.<body>"` for a v1 signature.
//!
//! What it answers is up to the test: [`Webhook::respond_with`] installs a function of the
//! request (503 for an outage, 400 for one path, ...); the default is 200. Only requests answered
//! 2xx count as delivered ([`Webhook::delivered`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type Responder = Arc<dyn Fn(&Received) -> u16 + Send + Sync>;

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    /// Path and query, as sent (percent-encoding kept).
    pub path: String,
    /// Lower-case names, raw values, in arrival order.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// What the receiver answered.
    pub status: u16,
    /// `Some(true)` when a secret was given and the signature matched; `None` without a secret.
    pub signature_ok: Option<bool>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }

    pub fn header_str(&self, name: &str) -> Option<String> {
        self.header(name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    pub fn is_batch(&self) -> bool {
        self.header("content-type").is_some_and(|c| c.starts_with(b"application/cloudevents-batch+json"))
    }

    /// The event ids this request carried: `ce-id`, or each batch element's `id`.
    pub fn event_ids(&self) -> Vec<String> {
        if self.is_batch() {
            let v: serde_json::Value = serde_json::from_slice(&self.body).expect("a batch body is JSON");
            v.as_array().expect("a batch is an array").iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect()
        } else {
            self.header_str("ce-id").into_iter().collect()
        }
    }
}

struct Shared {
    requests: Mutex<Vec<Received>>,
    responder: Mutex<Responder>,
    secret: Option<Vec<u8>>,
    /// Answer with a body that never ends (64 KiB chunks until the client goes away).
    endless: AtomicBool,
}

pub struct Webhook {
    pub port: u16,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Webhook {
    /// Start answering 200 to everything. With `secret`, every request's signature is checked.
    pub fn start(secret: Option<&[u8]>) -> Webhook {
        Webhook::start_on(0, secret)
    }

    /// [`Webhook::start`] on a given port (0: any free one), e.g. where a daemon already points.
    pub fn start_on(port: u16, secret: Option<&[u8]>) -> Webhook {
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            responder: Mutex::new(Arc::new(|_: &Received| 200)),
            secret: secret.map(<[u8]>::to_vec),
            endless: AtomicBool::new(false),
        });
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind the webhook receiver");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let app = axum::Router::new().fallback(handle).with_state(state);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Webhook { port, shared, stop: Some(stop), thread: Some(thread) }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Answer each later request with `f(request)`'s status.
    pub fn respond_with(&self, f: impl Fn(&Received) -> u16 + Send + Sync + 'static) {
        *self.shared.responder.lock().unwrap() = Arc::new(f);
    }

    /// With `on`, later answers carry a body that never ends.
    pub fn answer_endless_bodies(&self, on: bool) {
        self.shared.endless.store(on, Ordering::Relaxed);
    }

    /// Every request so far, answered or not.
    pub fn requests(&self) -> Vec<Received> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The requests answered 2xx, in arrival order.
    pub fn delivered(&self) -> Vec<Received> {
        self.requests().into_iter().filter(|r| (200..300).contains(&r.status)).collect()
    }

    /// Event ids of the delivered requests, in arrival order, duplicates included.
    pub fn delivered_ids(&self) -> Vec<String> {
        self.delivered().iter().flat_map(Received::event_ids).collect()
    }

    /// Wait until at least `n` distinct event ids were delivered.
    pub fn wait_delivered(&self, n: usize, timeout: Duration) -> bool {
        super::wait_until(timeout, || {
            self.delivered_ids().into_iter().collect::<std::collections::HashSet<_>>().len() >= n
        })
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let headers: Vec<(String, Vec<u8>)> =
        headers.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
    let mut r = Received {
        method: method.to_string(),
        path: uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default(),
        headers,
        body: body.to_vec(),
        status: 0,
        signature_ok: None,
    };
    r.signature_ok = shared.secret.as_deref().map(|k| verify(k, &r));
    let responder = shared.responder.lock().unwrap().clone();
    r.status = responder(&r);
    let status = StatusCode::from_u16(r.status).unwrap();
    shared.requests.lock().unwrap().push(r);
    if shared.endless.load(Ordering::Relaxed) {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let stream = futures_util::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
        return (status, axum::body::Body::from_stream(stream)).into_response();
    }
    status.into_response()
}

/// The receiver's side of the signing recipe in the README: the v2 signature (path, signed
/// headers, body) when the request has one, else the v1 signature (body only).
pub fn verify(secret: &[u8], r: &Received) -> bool {
    let Some(sig) = r.header_str("outboxd-signature") else { return false };
    let mut t = None;
    let (mut v1, mut v2) = (Vec::new(), Vec::new());
    for part in sig.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = Some(x.to_owned()),
            Some(("v1", x)) => v1.push(x.to_owned()),
            Some(("v2", x)) => v2.push(x.to_owned()),
            _ => {}
        }
    }
    let Some(t) = t else { return false };
    let mut mac = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(secret).unwrap();
    if v2.is_empty() {
        mac.update(t.as_bytes());
        mac.update(b".");
    } else {
        let Some(names) = r.header_str("outboxd-signed-headers") else { return false };
        mac.update(format!("{t}\n{}\n{names}\n", r.path).as_bytes());
        for name in names.split(',') {
            let values: Vec<&[u8]> = r.headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_slice()).collect();
            if values.is_empty() {
                return false;
            }
            mac.update(&values.join(&b", "[..]));
            mac.update(b"\n");
        }
    }
    mac.update(&r.body);
    let want: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    if v2.is_empty() {
        v1.contains(&want)
    } else {
        v2.contains(&want)
    }
}
