'use strict';
/**
 * onegrant-miniprogram's building blocks: the error type and codes, the storage keys,
 * the client's timing constants and small pure helpers. `onegrant.js` is the client;
 * this file has no state.
 */

/** The error codes API.md and the server answer, and the client's own: `network` (no
 *  answer at all) and `expired` (an action queued longer than the server remembers
 *  ids, 35 days). */
const ERROR_CODES = Object.freeze([
  'malformed_json', 'invalid_body', 'invalid_query', 'unauthorized', 'invalid_code',
  'invalid_code_format', 'not_found', 'idempotency_conflict', 'payload_too_large',
  'no_templates', 'too_many_templates', 'unknown_template', 'invalid_result',
  'invalid_request_id', 'invalid_action_id', 'invalid_grant', 'invalid_occurred_at',
  'invalid_count', 'invalid_daily_goal', 'invalid_interval', 'invalid_time',
  'invalid_timezone', 'invalid_waking_hours', 'invalid_quiet_hours', 'invalid_muted_types',
  'grant_limit', 'rate_limited', 'unavailable', 'internal', 'network', 'expired', 'configuration',
  'dropped', 'not_stored',
]);

/** Why `wx.requestSubscribeMessage` failed, by its `errCode` (WeChat's table): a stable
 *  reason a page can act on. 20004 is the user's main switch, off; 10005 a popup the
 *  app could not show (it went to the background). */
const SUBSCRIBE_FAILURES = Object.freeze({
  10001: 'no_templates',
  10002: 'network',
  10003: 'network',
  10004: 'template_invalid',
  10005: 'ui_unavailable',
  20001: 'template_invalid',
  20002: 'templates_mixed',
  20003: 'too_many_templates',
  20004: 'switched_off',
  20005: 'subscribe_banned',
  20013: 'template_not_allowed',
});

/** The failure of a subscribe call, as results and `onError` carry it: `{code:
 *  'subscribe_failed', errCode, reason, message}`. Without an errCode, a call outside a
 *  tap is `not_in_tap`; anything else `unknown`. */
function subscribeFailure(err) {
  const message = (err && err.errMsg) || 'requestSubscribeMessage failed';
  const given = err && err.errCode;
  const errCode = given !== undefined && given !== null && given !== '' && Number.isFinite(Number(given))
    ? Number(given) : null;
  let reason = errCode !== null && SUBSCRIBE_FAILURES[errCode];
  if (!reason) reason = /TAP gesture|user tap/i.test(message) ? 'not_in_tap' : 'unknown';
  return { code: 'subscribe_failed', errCode, reason, message };
}

/** wx.request failures that retrying cannot mend: the API's domain missing from the
 *  mini-program's request domains, or a certificate or TLS error. Anything else (no
 *  network, a timeout, a dropped connection) is `network` and retried. */
const DOMAIN_FAILURE = /not in domain list|url not in/i;
const TLS_FAILURE = /\bssl\b|\btls\b|certificate|handshake|ERR_CERT_|ERR_SSL_/i;

/** The error for a wx.request or wx.login that got no answer. A configuration error
 *  carries `domain` when the request domains lack the API's (only a release mends it;
 *  a TLS error may be a captive portal or a wrong clock). */
function noAnswer(err, fallback) {
  const message = (err && err.errMsg) || fallback;
  const domain = DOMAIN_FAILURE.test(message);
  const error = new OnegrantError(0, domain || TLS_FAILURE.test(message) ? 'configuration' : 'network', message);
  if (domain) error.domain = true;
  return error;
}

/** The values `wx.requestSubscribeMessage` reports per template. */
const SUBSCRIBE_RESULTS = Object.freeze([
  'accept', 'acceptWithAudio', 'acceptWithAlert', 'reject', 'ban', 'filter',
]);

/** A session token is renewed this long before it expires. */
const SESSION_MARGIN_MS = 60 * 1000;
/** A queued action still waiting for its tap's answer this long is sent without the
 *  grant (the page was closed while the popup was open). */
const STALE_TAP_MS = 2 * 60 * 1000;
/** Older actions are dropped: the server remembers ids for 35 days (README), so a later
 *  replay could count twice. */
const MAX_QUEUED_MS = 34 * 24 * 3600 * 1000;
/** How long to wait before the next submit after a 429 or 503 that named no time. */
const DEFAULT_RETRY_AFTER_S = 5;
/** The longest a stored `retryAt` holds the queue back: a later one was written by a
 *  clock since set back, or a server asking for more than it ever does. */
const MAX_RETRY_WAIT_MS = 10 * 60 * 1000;
/** The most actions kept queued; past it the oldest are dropped first (and counted). A
 *  check-in is a few hundred bytes: the queue stays far below WeChat's 1 MB per key. */
const MAX_QUEUE = 200;

/** The storage keys of a client of `baseUrl`: one queue and session per backend. */
function storageKeys(baseUrl) {
  const at = String(baseUrl).replace(/\/+$/, '');
  return Object.freeze({
    session: `onegrant.session@${at}`,
    queue: `onegrant.queue@${at}`,
    cache: `onegrant.cache@${at}`,
    retryAt: `onegrant.retryAt@${at}`,
  });
}

/**
 * What the server (or the network) answered. `status` is the HTTP status (0: no answer);
 * `code` one of ERROR_CODES; `retryAfter` seconds, when the server said.
 */
class OnegrantError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message || code);
    this.name = 'OnegrantError';
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
    /** Whether sending the same request later may succeed: no answer (but not a
     *  configuration error), 401 (after a new session), 429 or 5xx. A definite 4xx never
     *  changes by retrying. An own property: it survives a spread and JSON. */
    this.retryable = (status === 0 && code !== 'configuration') || status === 401 || status === 429 || status >= 500;
  }
}

/** Whether `e` is an OnegrantError (by shape: subclassing may not survive a transpiler). */
function isOnegrantError(e) {
  return Boolean(e) && e.name === 'OnegrantError' && typeof e.status === 'number';
}

/** The code of a failure whose body names none (API Gateway's own 429, say). */
function codeOf(status) {
  return {
    400: 'invalid_body', 401: 'unauthorized', 404: 'not_found', 409: 'idempotency_conflict',
    413: 'payload_too_large', 422: 'invalid_body', 429: 'rate_limited',
  }[status] || (status >= 500 ? 'unavailable' : 'internal');
}

function isSubscribeResult(value) {
  return SUBSCRIBE_RESULTS.indexOf(value) >= 0;
}

/** A client id: `prefix` and time and randomness (API.md: 1–64 of `[A-Za-z0-9_.:-]`). */
function defaultId(prefix, now) {
  let random = '';
  while (random.length < 12) {
    random += Math.floor(Math.random() * 36 ** 6).toString(36).padStart(6, '0');
  }
  return `${prefix}${now.toString(36)}_${random.slice(0, 12)}`;
}

function headerValue(headers, name) {
  if (!headers) return undefined;
  const wanted = name.toLowerCase();
  for (const key of Object.keys(headers)) {
    if (key.toLowerCase() === wanted) return headers[key];
  }
  return undefined;
}

function query(params) {
  const parts = [];
  for (const key of Object.keys(params)) {
    const value = params[key];
    if (value === undefined || value === null) continue;
    parts.push(`${encodeURIComponent(key)}=${encodeURIComponent(String(value))}`);
  }
  return parts.length ? `?${parts.join('&')}` : '';
}

/** `promise`, or a `network` failure after `ms` if it has not settled (an adapter that
 *  never calls back must not hold the queue for good). */
function deadline(promise, ms, what) {
  let timer;
  const late = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(new OnegrantError(0, 'network', `${what} did not answer`)), ms);
  });
  return Promise.race([promise, late]).then(
    (value) => { clearTimeout(timer); return value; },
    (error) => { clearTimeout(timer); throw error; },
  );
}

function merge(first, second) {
  return {
    answers: Object.assign({}, first.answers, second.answers),
    pending: second.pending,
  };
}

module.exports = {
  ERROR_CODES,
  SUBSCRIBE_RESULTS,
  SESSION_MARGIN_MS,
  STALE_TAP_MS,
  MAX_QUEUED_MS,
  DEFAULT_RETRY_AFTER_S,
  MAX_RETRY_WAIT_MS,
  MAX_QUEUE,
  SUBSCRIBE_FAILURES,
  subscribeFailure,
  noAnswer,
  storageKeys,
  OnegrantError,
  isOnegrantError,
  codeOf,
  isSubscribeResult,
  defaultId,
  headerValue,
  query,
  deadline,
  merge,
};
