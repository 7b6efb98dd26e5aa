//! The inbox API: `GET /v1/notifications`, `GET /v1/notifications/unread-count`,
//! `POST /v1/notifications/{id}/read`, `POST /v1/notifications/read-all`, and the
//! user's push preferences, `GET`/`PUT /v1/preferences`, forgetting the user,
//! `DELETE /v1/me`, and a copy of their data, `GET /v1/me/export`.
//!
//! Every query runs in the caller's own partition: a cursor holds only a position, and
//! an id that is not the caller's answers 404 (I8).

use futures::future::BoxFuture;
use lambda_http::http::Method;
use lambda_http::{Body, Request, RequestExt, Response};
use onegrant::Deps;
use onegrant::domain::erasure::ErasureCause;
use onegrant::domain::inbox::preferences::Preferences;
use onegrant::domain::inbox::{decode_cursor, is_notification_id};
use onegrant::http::{
    ApiError, authenticate_read, bearer, caller, json_body, json_response, respond,
};
use onegrant::store::inbox::ListFilter;
use serde_json::json;

/// Page sizes the list accepts.
const MAX_LIMIT: usize = 100;
const DEFAULT_LIMIT: usize = 20;

/// The handler as `onegrant::http::run` and the local stack take it.
pub fn handler(deps: &Deps, req: Request) -> BoxFuture<'_, Response<Body>> {
    let budget = onegrant::http::budget(&req, deps.config.limits.handler_budget);
    let route = onegrant::http::route(&req);
    Box::pin(onegrant::http::within(budget, route, handle(deps, req)))
}

/// The function's handler: one request in, one response out.
pub async fn handle(deps: &Deps, req: Request) -> Response<Body> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let result = match (req.method().clone(), path.as_str()) {
        (Method::GET, "/v1/notifications") => list(deps, &req).await,
        (Method::GET, "/v1/notifications/unread-count") => unread(deps, &req).await,
        (Method::POST, "/v1/notifications/read-all") => read_all(deps, &req).await,
        (Method::POST, p) if p.ends_with("/read") => read_one(deps, &req).await,
        (Method::GET, "/v1/preferences") => preferences(deps, &req).await,
        (Method::PUT, "/v1/preferences") => save_preferences(deps, &req).await,
        (Method::DELETE, "/v1/me") => erase_me(deps, &req).await,
        (Method::GET, "/v1/me/export") => export(deps, &req).await,
        // API Gateway routes only the declared routes here.
        _ => Err(ApiError::NotFound),
    };
    respond(result)
}

fn bad_query(message: &str) -> ApiError {
    ApiError::InvalidQuery(message.to_string())
}

async fn list(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let query = req.query_string_parameters();
    let limit = match query.first("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| bad_query("limit must be a whole number from 1 to 100"))?,
    };
    let after = match query.first("cursor") {
        None | Some("") => None,
        Some(c) => {
            Some(decode_cursor(c).ok_or_else(|| bad_query("cursor is not one this API issued"))?)
        }
    };
    let read = match query.first("read") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => return Err(bad_query("read must be true or false")),
    };
    let kind = match query.first("type") {
        None => None,
        Some(t) if !t.is_empty() && t.chars().count() <= 32 => Some(t.to_string()),
        Some(_) => return Err(bad_query("type must be 1 to 32 characters")),
    };
    // Counted once the request is known good: a bad one reads and writes nothing.
    let openid = caller.admitted(deps).await?;
    deps.store.count_read(&openid, deps.clock.now()).await?;
    let page = deps
        .store
        .notifications(&openid, limit, after.as_deref(), &ListFilter { read, kind })
        .await?;
    json_response(200, &page)
}

async fn unread(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let openid = authenticate_read(req, deps).await?;
    let unread = deps.store.unread(&openid).await?;
    json_response(200, &json!({"unread": unread}))
}

async fn read_one(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let id = req
        .path_parameters()
        .first("id")
        .filter(|id| is_notification_id(id))
        .map(str::to_string)
        .ok_or(ApiError::NotFound)?;
    let openid = caller.admitted(deps).await?;
    let note = deps
        .store
        .mark_read(&openid, &id, deps.clock.now())
        .await?
        .ok_or(ApiError::NotFound)?;
    json_response(200, &note)
}

async fn read_all(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let openid = caller(req, &deps.sessions).await?.admitted(deps).await?;
    let done = deps.store.read_all(&openid, deps.clock.now()).await?;
    json_response(200, &json!({"updated": done.updated, "more": done.more}))
}

async fn preferences(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let openid = authenticate_read(req, deps).await?;
    let prefs = deps.store.preferences(&openid).await?;
    json_response(200, &prefs)
}

async fn save_preferences(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    // Checked whole before anything is read.
    let wanted = Preferences::from_json(&json_body(req)?)?;
    let openid = caller.admitted(deps).await?;
    let saved = deps
        .store
        .save_preferences(&openid, &wanted, deps.clock.now())
        .await?;
    json_response(200, &saved)
}

/// Forgets the caller (`domain::erasure`): the erasure begun and a first bounded step
/// taken at once, the rest by the dispatcher's ticks. Asked again, or with a token
/// the erasure refuses (one issued before it), it only answers the erasure's state: an
/// old token never begins another erasure of a user who came back. Answers 202.
async fn erase_me(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let (openid, issued_at) = bearer(req, &deps.sessions).await?;
    let now = deps.clock.now();
    if let Some(tombstone) = deps.store.tombstone(&openid).await? {
        if !tombstone.admits_token(issued_at) {
            return json_response(202, &json!({"erasure": tombstone.state.as_str()}));
        }
        // A user who came back after an erasure asks for another.
        if tombstone.reopened_by(issued_at) {
            deps.store.reopen(&openid, &tombstone).await?;
        }
    }
    let mut erasure = deps
        .store
        .start_erasure(&openid, ErasureCause::Request, now)
        .await?;
    if erasure.begun {
        erasure = deps.store.erase_step(&openid, now).await?;
    }
    json_response(202, &json!({"erasure": erasure.state.as_str()}))
}

/// A copy of the caller's data (`domain::export`): one page of at most 100 items, and
/// the cursor of the next (`null` at the end). Counted as a read.
async fn export(deps: &Deps, req: &Request) -> Result<Response<Body>, ApiError> {
    let caller = caller(req, &deps.sessions).await?;
    let after = match req.query_string_parameters().first("cursor") {
        None | Some("") => None,
        Some(c) => Some(
            onegrant::domain::export::decode_cursor(c)
                .ok_or_else(|| bad_query("cursor is not one this API issued"))?,
        ),
    };
    // Counted once the request is known good: a bad one reads and writes nothing.
    let openid = caller.admitted(deps).await?;
    deps.store.count_read(&openid, deps.clock.now()).await?;
    let page = deps.store.export_page(&openid, after.as_deref()).await?;
    let next = page
        .next
        .as_deref()
        .map(onegrant::domain::export::encode_cursor);
    json_response(200, &json!({"items": page.items, "next_cursor": next}))
}
