//! Calling the publisher API as a publisher's backend does: each request signed
//! (`X-Onegrant-Publisher`, `-Timestamp`, `-Signature`), or deliberately not.

use onegrant::domain::publisher::Publishers;
use onegrant::domain::publisher::signature::{self, Request};
use serde_json::Value;

use crate::support::app::{Answer, TestApp};

/// An order-shipped notification for `openid` under `key`, with a push of the order
/// template, and `extra` fields set over it.
pub fn order_detail(openid: &str, key: &str, extra: Value) -> Value {
    let mut detail = serde_json::json!({"idempotency_key": key, "openid": openid, "type": "order",
        "title": "订单已发货", "body": format!("订单 {key}"),
        "wechat": {"template_id": crate::ORDER,
                   "data": {"character_string1": key, "phrase2": "已发货", "thing3": "门店"}}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        detail[k] = v.clone();
    }
    detail
}

/// The local stack's default publisher and key (`onegrant_local::stack::LOCAL_PUBLISHER`).
pub const SHOP: Signer = Signer {
    source: "com.example.shop",
    key: "local-publisher-secret",
    skew: 0,
};

/// Who signs a request, with which key, and how far off its clock is (seconds).
#[derive(Debug, Clone, Copy)]
pub struct Signer {
    pub source: &'static str,
    pub key: &'static str,
    pub skew: i64,
}

impl Signer {
    /// The same publisher signing with `key`.
    pub fn with_key(self, key: &'static str) -> Self {
        Self { key, ..self }
    }

    /// The same publisher, its clock `skew` seconds off.
    pub fn off_by(self, skew: i64) -> Self {
        Self { skew, ..self }
    }

    /// The `X-Onegrant-Signature` of `method target body` at `timestamp`.
    pub fn sign(&self, timestamp: i64, method: &str, target: &str, body: &[u8]) -> String {
        let json = serde_json::json!([{"source": self.source, "key": self.key}]).to_string();
        let publishers = Publishers::parse(&json).expect("a signer's key is a valid key");
        let publisher = publishers.get(self.source).expect("listed");
        signature::sign(
            publisher.current_key(),
            timestamp,
            &Request {
                method,
                target,
                body,
            },
        )
    }
}

impl TestApp {
    /// `method target` to the publisher API, signed by `signer` (`None`: unsigned), its
    /// answer checked against api/openapi.yaml.
    pub async fn publisher_call(
        &self,
        method: &str,
        target: &str,
        body: Option<&Value>,
        signer: Option<Signer>,
    ) -> Answer {
        let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON"));
        let http_method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .http
            .request(http_method, format!("{}{target}", self.base_url));
        if let Some(signer) = signer {
            let timestamp = self.now().timestamp() + signer.skew;
            // Signed as the API reads it: the path decoded, the query as sent.
            let (path, query) = match target.split_once('?') {
                Some((path, query)) => (path, Some(query)),
                None => (target, None),
            };
            let canonical = signature::target(path, query);
            let signed = signer.sign(
                timestamp,
                method,
                &canonical,
                bytes.as_deref().unwrap_or_default(),
            );
            request = request
                .header(signature::PUBLISHER_HEADER, signer.source)
                .header(signature::TIMESTAMP_HEADER, timestamp.to_string())
                .header(signature::SIGNATURE_HEADER, signed);
        }
        if let Some(bytes) = bytes {
            request = request
                .header("content-type", "application/json")
                .body(bytes);
        }
        let answer = Self::decode(request.send().await.expect("request reaches the API")).await;
        let path = target.split('?').next().unwrap_or(target);
        crate::openapi::assert_conforms(method, path, answer.status, &answer.body);
        answer
    }

    /// A notification published over HTTP by `signer`.
    pub async fn publish(&self, detail: &Value, signer: Signer) -> Answer {
        self.publisher_call(
            "POST",
            "/publisher/v1/notifications",
            Some(detail),
            Some(signer),
        )
        .await
    }
}

/// A publisher's webhook: every post it received (headers and body), answering 200, or
/// 503 while it is `Receiver::down`.
#[derive(Clone)]
pub struct Receiver {
    pub url: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _task: std::sync::Arc<tokio::task::JoinHandle<()>>,
}

/// One post a [`Receiver`] took, and how it answered (200, or 503 while down).
#[derive(Debug, Clone)]
pub struct Received {
    /// Its path and query as they reached the receiver (the path percent-encoded).
    pub uri: axum::http::Uri,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
    pub outcome: Value,
    pub answered: u16,
}

impl Receiver {
    /// A receiver on a free port of this machine, up.
    pub async fn spawn() -> Self {
        use std::sync::atomic::Ordering;
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let delay_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (r, d, late) = (received.clone(), down.clone(), delay_ms.clone());
        // (Any path: the webhook's is `/hooks/订单 1`, which travels percent-encoded.)
        let router = axum::Router::new().fallback(axum::routing::post(
            move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let (r, d, late) = (r.clone(), d.clone(), late.clone());
                async move {
                    let delay = late.load(Ordering::SeqCst);
                    if delay > 0 {
                        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                    }
                    let status = if d.load(Ordering::SeqCst) {
                        axum::http::StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        axum::http::StatusCode::OK
                    };
                    let outcome = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    r.lock().unwrap_or_else(|p| p.into_inner()).push(Received {
                        uri,
                        headers,
                        body: body.to_vec(),
                        outcome,
                        answered: status.as_u16(),
                    });
                    status
                }
            },
        ));
        let (base, task) = crate::support::app::serve(router).await;
        Self {
            url: format!("{base}/hooks/订单 1?shop=1"),
            received,
            down,
            delay_ms,
            _task: std::sync::Arc::new(task),
        }
    }

    /// Answers 503 (`true`) or 200 from now on.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answers each post `delay` late (real time: a slow webhook).
    pub fn set_delay(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every post so far, taken or refused.
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Received {
    /// Whether the post is signed by onegrant (publisher `onegrant`) with `key`, over
    /// its target as the publisher API's scheme reads it from the request received
    /// (the path percent-decoded, the query as sent) and the raw body.
    pub fn signed_with(&self, key: &'static str) -> bool {
        let target = signature::target(self.uri.path(), self.uri.query());
        let header = |name: &str| {
            self.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let Ok(timestamp) = header(signature::TIMESTAMP_HEADER).parse::<i64>() else {
            return false;
        };
        let signer = Signer {
            source: "onegrant-check",
            key,
            skew: 0,
        };
        header(signature::PUBLISHER_HEADER) == signature::ONEGRANT
            && header(signature::SIGNATURE_HEADER)
                == signer.sign(timestamp, "POST", &target, &self.body)
    }
}

impl TestApp {
    /// One tick of the outcomes function (what its schedule runs each minute), with two
    /// minutes of time: what a tick reads it gets through, however loaded the machine
    /// (with 30 s, eight tests at once on two cores cut a tick's 200 moves short, and a
    /// test counting ticks failed). A tick ends as soon as it is done.
    pub async fn deliver_outcomes(&self) -> outcomes::Summary {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        outcomes::tick(&self.deps, deadline)
            .await
            .expect("the outcomes tick reads the table")
    }
}
