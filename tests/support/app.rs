//! [`TestApp`]: a fresh onegrant for one test (table, stand-in, HTTP API, functions),
//! and the calls a test makes through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::AttributeValue;
use onegrant::Deps;
use onegrant_local::emulator::Emulator;
use onegrant_local::{api, stack, standin};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::invariants::attr_n;
use crate::support::round_trips::{ItemWrite, RoundTrips, item_size};
use crate::support::table::{Leased, TestTable};
use crate::{faults, openapi};

/// One test's running onegrant: API, stand-in and table.
pub struct TestApp {
    pub base_url: String,
    /// The Lambda Invoke API for the same functions.
    pub invoke_url: String,
    pub standin_url: String,
    pub http: reqwest::Client,
    pub table: TestTable,
    pub deps: Deps,
    /// Every DynamoDB request the functions send.
    pub round_trips: RoundTrips,
    /// The time every function of this app (and its stand-in) reads: the test moves it
    /// ([`TestApp::advance`]) instead of waiting.
    pub clock: onegrant::Clock,
    /// The asynchronous invocations of its Invoke API still running (a fanning-out
    /// tick's workers): [`TestApp::workers_done`] waits for them.
    pub invocations: api::Running,
    /// The items [`TestApp::ttl_pass`] removed, so ledger checks still add up.
    pub expired: Arc<Mutex<Vec<HashMap<String, AttributeValue>>>>,
    // Declared after `table`, so the table is deleted before the emulator is killed.
    pub(crate) _emulator: Option<Emulator>,
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Words that only WeChat, the HTTP client or the SDK produce: no answer of onegrant's
/// may carry them (API.md: bodies never carry internal details). Checked on every
/// response the suite decodes, like the OpenAPI check.
pub(crate) const INTERNAL_WORDS: [&str; 10] = [
    "errmsg",
    "errcode",
    "rid:",
    "error sending request",
    "operation timed out",
    "connection refused",
    "dispatch failure",
    "dynamodb",
    "conditionalcheckfailed",
    "transactioncanceled",
];

fn assert_nothing_internal(status: u16, body: &[u8]) {
    let text = String::from_utf8_lossy(body).to_lowercase();
    for word in INTERNAL_WORDS {
        assert!(
            !text.contains(word),
            "a {status} answer carries {word:?}: {text}"
        );
    }
}

/// A plain HTTP response, decoded.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

pub(crate) async fn serve(router: axum_router::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let addr = listener.local_addr().expect("local addr");
    let task = tokio::spawn(async move {
        let _ = axum_router::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await;
    });
    (format!("http://{addr}"), task)
}

/// Re-exported so tests need no direct axum dependency.
pub mod axum_router {
    pub use axum::{Router, serve};
}

/// Starts a fresh onegrant for one test. `overrides` replace config values.
pub async fn spawn_app_with(overrides: &[(&'static str, &str)]) -> TestApp {
    spawn_app_on(overrides, None, None).await
}

/// Like [`spawn_app_with`], with the functions' DynamoDB client going through a
/// [`faults::FaultProxy`] (the test's own reads go straight to the emulator). The
/// client retries and times out as a deployed one does, only faster: 3 attempts, a
/// 1-second attempt timeout, 10 ms first backoff.
pub async fn spawn_faulty_app(overrides: &[(&'static str, &str)]) -> (TestApp, faults::FaultProxy) {
    let leased = Leased::take().await;
    let proxy = faults::FaultProxy::start(leased.endpoint()).await;
    let app = spawn_app_on(overrides, None, Some((leased, &proxy.url))).await;
    (app, proxy)
}

/// Like [`spawn_app_with`], on an emulator of its own: for load tests, which would
/// otherwise slow every test sharing the suite's emulator (moto applies requests one
/// at a time).
pub async fn spawn_app_isolated(overrides: &[(&'static str, &str)]) -> TestApp {
    let emulator = Emulator::start(true).expect("a dedicated emulator starts");
    spawn_app_on(overrides, Some(emulator), None).await
}

pub(crate) async fn spawn_app_on(
    overrides: &[(&'static str, &str)],
    emulator: Option<Emulator>,
    // The emulator and, in front of it, the fault proxy the functions go through.
    proxied: Option<(Leased, &str)>,
) -> TestApp {
    let (leased, proxy) = match proxied {
        Some((leased, url)) => (Some(leased), Some(url)),
        None => (None, None),
    };
    // Logs go through the test harness's capture: shown only for failing tests.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .try_init();
    // reqwest is built without a default TLS provider; onegrant installs ring.
    onegrant::aws::install_crypto_provider();
    let table = match (&emulator, leased) {
        (Some(e), _) => TestTable::create_on(e.endpoint()).await,
        (None, Some(leased)) => TestTable::create_leased(leased).await,
        (None, None) => TestTable::create().await,
    };
    let standin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let standin_url = format!(
        "http://{}",
        standin_listener.local_addr().expect("local addr")
    );
    // The Invoke API's address is part of the config (a fanning-out tick invokes its
    // workers there), so it is bound first.
    let invoke_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
    let invoke_url = format!(
        "http://{}",
        invoke_listener.local_addr().expect("local addr")
    );
    let mut values: HashMap<&str, String> = HashMap::from([
        ("DISPATCH_FUNCTION_NAME", "dispatcher".to_string()),
        ("AWS_ENDPOINT_URL_LAMBDA", invoke_url.clone()),
        ("TABLE_NAME", table.name.clone()),
        ("WECHAT_API_BASE", standin_url.clone()),
        ("WECHAT_APPID", stack::LOCAL_APPID.to_string()),
        ("WECHAT_SECRET", stack::LOCAL_SECRET.to_string()),
        ("SESSION_SECRET", stack::LOCAL_SESSION_SECRET.to_string()),
        ("ONEGRANT_TEMPLATES", stack::LOCAL_TEMPLATES.to_string()),
        ("ONEGRANT_REMINDERS", stack::LOCAL_REMINDERS.to_string()),
        ("WECHAT_TIMEOUT_MS", "2000".to_string()),
        ("NOTIFY_SOURCES", "tests,com.example.shop".to_string()),
    ]);
    if proxy.is_none() {
        // The suite's emulator applies one request at a time, on a loaded machine:
        // contended writes take far longer to get through than on DynamoDB. The fault
        // tests keep the deployed budget.
        values.insert("WRITE_BUDGET_MS", "20000".to_string());
        // And the handler's own budget stays above it, as the deployed 9 s is above 4 s.
        values.insert("HANDLER_BUDGET_MS", "30000".to_string());
    }
    for (k, v) in overrides {
        values.insert(k, v.to_string());
    }
    let config = stack::local_config(&values).expect("test config is valid");
    let clock = onegrant::Clock::test();
    let standin_task = standin::spawn(
        standin::StandinConfig {
            clock: clock.clone(),
            ..stack::standin_config(&config)
        },
        standin_listener,
    );
    let round_trips = RoundTrips::default();
    let functions_client = match proxy {
        None => table.client.clone(),
        Some(url) => {
            let config = table
                .client
                .config()
                .to_builder()
                .endpoint_url(url)
                .retry_config(
                    aws_sdk_dynamodb::config::retry::RetryConfig::standard()
                        .with_max_attempts(3)
                        .with_initial_backoff(std::time::Duration::from_millis(10)),
                )
                .timeout_config(onegrant::aws::dynamodb_timeouts(
                    std::time::Duration::from_secs(1),
                ))
                .build();
            aws_sdk_dynamodb::Client::from_conf(config)
        }
    };
    let deps = stack::deps_on(config, round_trips.attach(&functions_client), clock.clone())
        .expect("deps build");
    let (base_url, api_task) = serve(api::api_router(deps.clone()).expect("router builds")).await;
    let (router, invocations) = api::invoke_router(deps.clone()).expect("router builds");
    let invoke_task = tokio::spawn(async move {
        let _ = axum_router::serve(invoke_listener, router).await;
    });
    TestApp {
        base_url,
        invoke_url,
        standin_url,
        http: onegrant::aws::http_client_builder()
            .build()
            .expect("an HTTP client"),
        table,
        deps,
        round_trips,
        clock,
        invocations,
        expired: Arc::default(),
        _emulator: emulator,
        tasks: vec![standin_task, api_task, invoke_task],
    }
}

/// Starts a fresh onegrant taking safe-mode JSON pushes (the local stack's push
/// settings), with its stand-in pushing there like WeChat, each event `copies` times
/// at once; dispatch timeouts short enough for 20-second test ticks.
pub async fn spawn_pushing_app(copies: u32) -> TestApp {
    spawn_pushing_app_with(copies, &[]).await
}

/// Like [`spawn_pushing_app`], with `extra` config values on top.
pub async fn spawn_pushing_app_with(copies: u32, extra: &[(&'static str, &str)]) -> TestApp {
    let app = spawn_app_with(&pushing_overrides(extra)).await;
    point_pushes(&app, copies).await;
    app
}

/// Like [`spawn_pushing_app`], with the fault proxy between the functions and the
/// emulator.
pub async fn spawn_faulty_pushing_app(copies: u32) -> (TestApp, faults::FaultProxy) {
    let leased = Leased::take().await;
    let proxy = faults::FaultProxy::start(leased.endpoint()).await;
    let app = spawn_app_on(&pushing_overrides(&[]), None, Some((leased, &proxy.url))).await;
    point_pushes(&app, copies).await;
    (app, proxy)
}

pub(crate) fn pushing_overrides<'a>(
    extra: &[(&'static str, &'a str)],
) -> Vec<(&'static str, &'a str)> {
    let mut overrides: Vec<(&'static str, &str)> = stack::LOCAL_PUSH.to_vec();
    overrides.extend([
        ("DISPATCH_LOOKAHEAD_SECONDS", "5"),
        ("WECHAT_TIMEOUT_MS", "1500"),
    ]);
    overrides.extend_from_slice(extra);
    overrides
}

/// Points the stand-in's pushes at `app`'s callback, each posted `copies` times.
pub(crate) async fn point_pushes(app: &TestApp, copies: u32) {
    let target = stack::standin_push(&app.deps.config, &app.base_url).expect("push configured");
    let mut target = serde_json::to_value(target).expect("a push target");
    target["copies"] = json!(copies);
    app.control("POST", "push-target", Some(target)).await;
}

/// Starts a fresh onegrant for one test with the local defaults.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

/// The local templates' ids.
pub const WATER: &str = "tmpl_water_reminder";

pub const ORDER: &str = "tmpl_order_status";

impl TestApp {
    /// What time it is for this app.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// Holds this app's clock at the start of the next minute, for a test whose
    /// requests must all count in one minute (the per-minute limits), however slow the
    /// machine: no earlier request counts in it, and it never ends under the test.
    pub fn freeze_at_a_minute_start(&self) {
        let next = (self.now().timestamp().div_euclid(60) + 1) * 60;
        self.clock.freeze_at(
            chrono::DateTime::from_timestamp(next, 0).expect("a minute within chrono's range"),
        );
    }

    /// Holds this app's running clock where it is until [`TestApp::let_clock_run`]: for
    /// set-up that must all happen before an instant a few seconds ahead (a `send_at`)
    /// however slow the machine — on the live clock, a slow ingest passed the instant
    /// and the notification was published at once instead of scheduled.
    pub fn hold_clock(&self) {
        self.clock.freeze_at(self.now());
    }

    /// Lets a clock held by [`TestApp::hold_clock`] run on from where it was held.
    pub fn let_clock_run(&self) {
        self.clock.run();
    }

    /// Moves this app's clock on to `at`, if it is not there yet (never back).
    pub fn move_to(&self, at: chrono::DateTime<chrono::Utc>) {
        if at > self.now() {
            self.clock.set(at);
        }
    }

    /// Moves this app's clock on to the next midday in China (04:00 UTC, 12:00 in
    /// Shanghai): hours from the local reminders' sleeping hours (22:00–08:00 there)
    /// and from China's midnight, whatever the hour here. For a test whose reminders
    /// may be given back unsent and retried — a retry never falls in sleeping hours, so
    /// at night here it would wait for the morning there — or whose counts are China's
    /// day's.
    pub fn move_to_china_midday(&self) {
        let now = self.now();
        let midday = now
            .date_naive()
            .and_hms_opt(4, 0, 0)
            .expect("04:00 exists")
            .and_utc();
        self.move_to(if midday > now {
            midday
        } else {
            midday + chrono::Duration::days(1)
        });
    }

    /// Makes `by` pass for this app at once: everything waiting on its clock (a
    /// dispatcher waiting for an instant) looks at the time again.
    pub fn advance(&self, by: std::time::Duration) {
        self.clock.advance(by);
    }

    /// Waits until the asynchronous invocations (a fanning-out tick's workers) have
    /// ended, as Lambda's would on their own (each has the function's 55 s budget).
    pub async fn workers_done(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(120), self.invocations.idle())
            .await
            .expect("the asynchronous invocations end within their budget");
    }

    /// Waits until the emulator has answered every request it took in (read twice,
    /// 100 ms apart, from `GET /_onegrant/busy`): a request a killed process sent just
    /// before it died still lands, as it would on DynamoDB, and a test counting what
    /// the crash left counts after it.
    pub async fn emulator_quiet(&self) {
        let url = format!("{}/_onegrant/busy", self.table.endpoint());
        let in_flight = || async {
            let busy: Value = reqwest::get(&url)
                .await
                .expect("the emulator answers")
                .json()
                .await
                .expect("busy is JSON");
            busy["in_flight"].as_u64().expect("in_flight is counted")
        };
        let mut quiet_reads = 0;
        for _ in 0..600 {
            quiet_reads = if in_flight().await == 0 {
                quiet_reads + 1
            } else {
                0
            };
            if quiet_reads == 2 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the emulator still had requests in flight after a minute");
    }

    pub(crate) async fn decode(response: reqwest::Response) -> Answer {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("response body");
        assert_nothing_internal(status, &bytes);
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!(
                    "non-JSON body ({status}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        Answer {
            status,
            headers,
            body,
        }
    }

    /// Sends `method path` with an optional bearer token and raw body, checks the answer
    /// against api/openapi.yaml, and returns it.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base_url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let answer = Self::decode(request.send().await.expect("request reaches the API")).await;
        openapi::assert_conforms(method.as_str(), path, answer.status, &answer.body);
        answer
    }

    /// Like [`TestApp::call`], retrying as the contract asks a client to: a 503 (checked
    /// to carry the error shape and `Retry-After`) is sent again, up to ten times. The
    /// answer, and how many 503s came before it.
    pub async fn call_retrying(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (Answer, usize) {
        for retried in 0..10 {
            let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON"));
            let answer = self.call(method, path, token, bytes).await;
            if answer.status != 503 {
                return (answer, retried);
            }
            assert_eq!(
                answer.body["error"]["code"], "unavailable",
                "{}",
                answer.body
            );
            assert!(
                answer.headers.contains_key("retry-after"),
                "503 without Retry-After"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        panic!("{method} {path} answered 503 ten times");
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> Answer {
        self.call(
            "POST",
            path,
            token,
            Some(serde_json::to_vec(body).expect("JSON")),
        )
        .await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.call("GET", path, token, None).await
    }

    /// Calls the stand-in's control API.
    pub async fn control(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self
            .http
            .request(method, format!("{}/control/{path}", self.standin_url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("stand-in reachable");
        assert!(
            response.status().is_success(),
            "control {path}: {}",
            response.status()
        );
        response.json().await.expect("control answers JSON")
    }

    /// A fresh `wx.login` code for `user`, and that user's openid.
    pub async fn login_code(&self, user: &str) -> (String, String) {
        let v = self
            .control("POST", "login-codes", Some(json!({"user": user})))
            .await;
        (
            v["code"].as_str().expect("code").to_string(),
            v["openid"].as_str().expect("openid").to_string(),
        )
    }

    /// Logs `user` in through `POST /v1/session` and returns the session token.
    pub async fn login(&self, user: &str) -> String {
        let (code, _) = self.login_code(user).await;
        let answer = self.post("/v1/session", None, &json!({"code": code})).await;
        assert_eq!(answer.status, 200, "login: {}", answer.body);
        answer.body["token"].as_str().expect("token").to_string()
    }

    /// Every item stored so far.
    pub async fn items(&self) -> Vec<HashMap<String, AttributeValue>> {
        self.table.items().await
    }

    /// Estimated write units of `writes` (see [`RoundTrips::take_writes`]) by
    /// DynamoDB's rules: per item, its size rounded up to 1 KB, twice in a transaction.
    /// Sizes are the items as they are now (DynamoDB bills the larger of before and
    /// after; for the small items here they round alike); a deleted item counts 1 KB.
    pub async fn write_units(&self, writes: &[ItemWrite]) -> usize {
        self.write_sizes(writes)
            .await
            .iter()
            .map(|(w, bytes)| bytes.div_ceil(1024).max(1) * if w.transactional { 2 } else { 1 })
            .sum()
    }

    /// Each write of `writes` with its item's size in bytes now (a deleted item counts
    /// 1 KB), as [`TestApp::write_units`] bills it.
    pub async fn write_sizes(&self, writes: &[ItemWrite]) -> Vec<(ItemWrite, usize)> {
        let mut sizes = Vec::new();
        for w in writes {
            let item = self
                .table
                .client
                .get_item()
                .table_name(&self.table.name)
                .key("pk", AttributeValue::S(w.pk.clone()))
                .key("sk", AttributeValue::S(w.sk.clone()))
                .send()
                .await
                .expect("get item")
                .item;
            sizes.push((w.clone(), item.map_or(1024, |i| item_size(&i))));
        }
        sizes
    }

    /// What DynamoDB's TTL does, as of `at`: every item whose `expires_at` (epoch
    /// seconds) is before `at` is deleted, conditional on `expires_at` being unchanged
    /// (TTL re-checks the attribute before it deletes). Returns how many it removed;
    /// they are kept in [`TestApp::expired`].
    pub async fn ttl_pass(&self, at: chrono::DateTime<chrono::Utc>) -> usize {
        let mut removed = 0;
        for item in self.items().await {
            let Some(expires) = attr_n(&item, "expires_at") else {
                continue;
            };
            if expires >= at.timestamp() {
                continue;
            }
            let deleted = self
                .table
                .client
                .delete_item()
                .table_name(&self.table.name)
                .key("pk", item["pk"].clone())
                .key("sk", item["sk"].clone())
                .condition_expression("expires_at = :e")
                .expression_attribute_values(":e", AttributeValue::N(expires.to_string()))
                .send()
                .await;
            if deleted.is_ok() {
                removed += 1;
                self.expired
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(item);
            }
        }
        removed
    }
}
