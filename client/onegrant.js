'use strict';
/**
 * onegrant-miniprogram: the mini-program half of onegrant. It gets right what is lost
 * before the server sees anything (README, "The mini-program client"):
 * - the tap: `wx.requestSubscribeMessage` is called synchronously inside the tap's call
 *   stack (`checkIn`, `requestGrants`), never after an `await`, which WeChat refuses;
 * - the grant: whether to ask comes from the server's `needs_grant` (cached by
 *   `prefetch`), never from a local count; only a standing refusal in the user's
 *   settings (`setting.js`, reported with each check-in and tap) skips the popup;
 * - the offline queue: every action is stored locally before anything else, with its
 *   ids generated once; a failed submit stays queued and is retried with the same ids
 *   until the server answers 2xx or a definite 4xx (surfaced, never retried).
 *
 * Dependency-free CommonJS (mini-programs `require` it; `onegrant.mjs` re-exports it as
 * an ES module). Every platform call goes through wx-shaped adapters, so it runs in a
 * mini-program (`createClient({ baseUrl })`, `wx` found globally) and in Node tests.
 */

const VERSION = '0.1.0';

const {
  ERROR_CODES, SUBSCRIBE_RESULTS, SUBSCRIBE_FAILURES, SESSION_MARGIN_MS,
  storageKeys, OnegrantError, isOnegrantError, codeOf, isSubscribeResult, defaultId, headerValue, deadline,
  subscribeFailure, noAnswer,
} = require('./support.js');
const { appOf, load, loadChecked, save } = require('./storage.js');
const { queueMethods } = require('./queue.js');
const { standingRefuses, standingMethods } = require('./setting.js');
const { inbox } = require('./inbox.js');

function isRecord(value) {
  return Boolean(value) && typeof value === 'object' && !Array.isArray(value);
}

/** A cache value in its shape: `{quotas: [], plans: {}, plansAt: {}, setting}`. */
function sane(cache) {
  const c = isRecord(cache) ? cache : {};
  c.quotas = Array.isArray(c.quotas) ? c.quotas.filter(isRecord) : [];
  c.plans = isRecord(c.plans) ? c.plans : {};
  c.plansAt = isRecord(c.plansAt) ? c.plansAt : {};
  if (c.setting !== undefined && !isRecord(c.setting)) delete c.setting;
  return c;
}

/** The mini-program's global `wx`, read as a free name (`typeof` of an undeclared name
 *  is safe): old iOS base libraries have no `globalThis`. */
function globalWx() {
  // eslint-disable-next-line no-undef
  return typeof wx === 'undefined' ? undefined : wx;
}

class Client {
  /**
   * @param {object} options see onegrant.d.ts (`ClientOptions`).
   */
  constructor(options) {
    const o = options || {};
    if (!o.baseUrl) throw new TypeError('createClient: baseUrl is required');
    const host = o.wx || globalWx();
    const bound = (name) => (host && typeof host[name] === 'function' ? host[name].bind(host) : undefined);
    this.baseUrl = String(o.baseUrl).replace(/\/+$/, '');
    this.keys = storageKeys(this.baseUrl);
    this.storage = o.storage || host;
    this.requestAdapter = o.request || bound('request');
    // A host-supplied session (`session`) means onegrant never calls wx.login, which
    // could replace the host app's session_key.
    this.sessionProvider = typeof o.session === 'function' ? o.session : null;
    this.loginAdapter = o.login || bound('login');
    this.subscribeAdapter = o.requestSubscribeMessage || bound('requestSubscribeMessage');
    // Optional: without it (a base library before 2.10.1) no standing choice is reported.
    this.settingAdapter = o.getSetting || bound('getSetting');
    if (!this.storage || !this.requestAdapter || !(this.loginAdapter || this.sessionProvider)
        || !this.subscribeAdapter) {
      throw new TypeError('createClient: no wx found; give storage, request, login (or session) and requestSubscribeMessage');
    }
    this.kinds = o.kinds || ['water'];
    this.templates = o.templates || {};
    this.timeout = o.timeout || 10000;
    this.now = o.now || (() => Date.now());
    this.newId = o.newId || ((prefix) => defaultId(prefix, this.now()));
    this.onError = o.onError || null;
    // One app's state, shared by every page's client (storage.js): one per `wx`.
    this.app = appOf(host || this.storage);
    if (this.app.foregroundSince === null) this.app.foregroundSince = this.now();
    this.listen(o.events || host);
  }

  // ---- storage -------------------------------------------------------------------

  /** A stored value, or `fallback` when never set or unreadable. Never throws. */
  read(key, fallback) {
    return load(this.storage, this.app, key, fallback);
  }

  /** Whether storage took `value` (if not, this app run keeps it in memory). */
  write(key, value) {
    return save(this.storage, this.app, key, value);
  }

  /** The cache, its parts checked: anything not of its shape (a corrupt or foreign
   *  value) is taken as absent, so it can neither throw nor suppress a popup. */
  cache() {
    return sane(this.read(this.keys.cache, null));
  }

  /** The plan of `kind` as last fetched (or answered to a check-in), or null. */
  cachedPlan(kind) {
    const plan = this.cache().plans[kind];
    return isRecord(plan) ? plan : null;
  }

  /** The quotas as last fetched, or []. */
  cachedQuotas() {
    return this.cache().quotas || [];
  }

  /** Caches `plan` as the server answered it now. */
  rememberPlan(kind, plan) {
    this.remember((cache) => {
      cache.plans = cache.plans || {};
      cache.plans[kind] = plan;
      cache.plansAt = cache.plansAt || {};
      cache.plansAt[kind] = this.now();
    });
  }

  /** Updates the cache; a cache that cannot be written is only a cache. */
  remember(change) {
    // A cache that cannot be read is not rebuilt over the one storage may still hold.
    const { value, unknown } = loadChecked(this.storage, this.app, this.keys.cache, null);
    if (unknown) return;
    const cache = sane(value);
    change(cache);
    cache.at = this.now();
    this.write(this.keys.cache, cache);
  }

  // ---- HTTP and session ---------------------------------------------------------

  /** One request through the adapter: resolves `{status, data, headers}`, rejects with a
   *  `network` error when there is no answer (offline, timeout, no callback). */
  send(method, path, body, token) {
    const sent = new Promise((resolve, reject) => {
      const header = { 'content-type': 'application/json' };
      if (token) header.Authorization = `Bearer ${token}`;
      const options = {
        url: this.baseUrl + path,
        method,
        header,
        timeout: this.timeout,
        success: (res) => resolve({ status: res.statusCode, data: res.data, headers: res.header || {} }),
        fail: (err) => reject(noAnswer(err, 'request failed')),
      };
      // wx.request turns a GET's data into query parameters: only writes carry a body.
      if (body !== undefined && method !== 'GET') options.data = body;
      this.requestAdapter(options);
    });
    return deadline(sent, this.timeout + 1000, 'wx.request');
  }

  static failure(answer) {
    const error = (answer.data && answer.data.error) || {};
    const retryAfter = Number(headerValue(answer.headers, 'retry-after'));
    return new OnegrantError(
      answer.status,
      error.code || codeOf(answer.status),
      error.message,
      Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : undefined,
    );
  }

  /** A session token: the stored one while it has more than a minute left, else a new
   *  one from `wx.login` and `POST /v1/session`. */
  token() {
    const session = this.read(this.keys.session, null);
    if (session && session.token && session.expiresAt - SESSION_MARGIN_MS > this.now()) {
      return Promise.resolve(session.token);
    }
    return this.relogin(session && session.token);
  }

  /** A new session, unless `stale` (the token that was refused) is already replaced.
   *  One login at a time for every page of the mini-program. A failure is marked
   *  `session`: it says nothing about the action that was being sent. */
  relogin(stale) {
    const session = this.read(this.keys.session, null);
    if (stale && session && session.token && session.token !== stale
        && session.expiresAt - SESSION_MARGIN_MS > this.now()) {
      return Promise.resolve(session.token);
    }
    const running = this.app.logins.get(this.keys.session);
    if (running) return running;
    const login = (this.sessionProvider ? this.hostSession(stale) : this.loginSession())
      .then((answer) => {
        const token = answer && answer.token;
        const expiresIn = Number(answer && answer.expires_in);
        if (typeof token !== 'string' || !token || !(expiresIn > 0)) {
          // Not a failure to retry: the session source answers in the wrong shape.
          throw new OnegrantError(0, 'configuration', 'the session answered no token or no expires_in');
        }
        if (stale && token === stale) {
          throw new OnegrantError(401, 'unauthorized', 'the session answered the token just refused');
        }
        this.write(this.keys.session, { token, expiresAt: this.now() + expiresIn * 1000 });
        return token;
      })
      .catch((error) => {
        const failed = isOnegrantError(error) ? error : new OnegrantError(0, 'network', String(error));
        failed.session = true;
        throw failed;
      });
    this.app.logins.set(this.keys.session, login);
    const done = () => { this.app.logins.delete(this.keys.session); };
    login.then(done, done);
    return login;
  }

  /** `wx.login` and `POST /v1/session`: resolves the API's answer (`{token, expires_in}`). */
  loginSession() {
    const code = deadline(new Promise((resolve, reject) => {
      this.loginAdapter({
        timeout: this.timeout,
        success: (res) => resolve(res && res.code),
        fail: (err) => reject(noAnswer(err, 'wx.login failed')),
      });
    }), this.timeout + 1000, 'wx.login');
    return code
      .then((c) => this.send('POST', '/v1/session', { code: c }))
      .then((answer) => {
        if (answer.status !== 200) throw Client.failure(answer);
        return answer.data || {};
      });
  }

  /** The host app's session (option `session`): `{token, expires_in}` as its backend
   *  made it; wx.login is never called, so the host's session_key stays valid. Told the
   *  token the API just refused (`{refused}`), so a cache of it can be bypassed. */
  hostSession(refused) {
    return deadline(Promise.resolve().then(() => this.sessionProvider({ refused: refused || null })),
      this.timeout + 1000, 'session');
  }

  /** An authenticated call: a 401 means one new session and one more try. */
  call(method, path, body) {
    return this.callAnswer(method, path, body).then((answer) => answer.data);
  }

  /** `call`, resolving `{data, replayed}`: `replayed` when the server answered an id
   *  it had applied before (`Idempotent-Replayed`), with what it answered then. */
  callAnswer(method, path, body) {
    return this.token().then((token) => this.send(method, path, body, token).then((answer) => {
      if (answer.status !== 401) return answer;
      return this.relogin(token).then((fresh) => this.send(method, path, body, fresh));
    })).then((answer) => {
      if (answer.status >= 200 && answer.status < 300) {
        const replayed = String(headerValue(answer.headers, 'idempotent-replayed')) === 'true';
        return { data: answer.data, replayed };
      }
      throw Client.failure(answer);
    }).catch((error) => {
      // A configuration error stops this app run's submits, wherever it is met first
      // (a prefetch, a read, a submit), and is reported once.
      if (isOnegrantError(error) && error.code === 'configuration') this.misconfigured(error);
      throw error;
    });
  }

  /** Records and reports (once) the configuration error that stops the queue. */
  misconfigured(error) {
    const key = this.keys.queue;
    if (this.app.misconfigured.has(key)) return;
    this.app.misconfigured.set(key, error);
    this.report(error);
  }

  // ---- quotas and plans ---------------------------------------------------------

  /**
   * On page show: submits what is queued, then fetches the quotas and every kind's plan
   * into the cache, so a tap never waits for the network before asking. Resolves with
   * `{quotas, plans, fresh}`: the cache, `fresh` when everything was fetched now (when
   * the network is down, what was cached before).
   */
  prefetch() {
    const get = (path) => this.call('GET', path).then((data) => ({ data }), (error) => ({ error }));
    return this.flush().catch(() => null).then(() => Promise.all([
      get('/v1/grants'),
      Promise.all(this.kinds.map((kind) => get(`/v1/reminders/${encodeURIComponent(kind)}`))),
      this.refreshSetting(),
    ])).then(([grants, plans]) => {
      this.remember((cache) => {
        if (grants.data) cache.quotas = grants.data.quotas;
        cache.plans = cache.plans || {};
        cache.plansAt = cache.plansAt || {};
        this.kinds.forEach((kind, i) => {
          if (!plans[i].data) return;
          cache.plans[kind] = plans[i].data;
          cache.plansAt[kind] = this.now();
        });
      });
      const cache = this.cache();
      const fresh = Boolean(grants.data) && plans.every((p) => p.data);
      return { quotas: cache.quotas || [], plans: cache.plans || {}, fresh };
    });
  }

  /** Whether a check-in of `kind` should ask for a grant: when nothing is cached, when
   *  the cached plan `needs_grant`, when it was cached before this foreground session
   *  (the reminder that opened the app may have spent the last grant), or when its
   *  `next_due_at` has passed (that reminder went out since). Asking once too often
   *  only adds a grant (bounded by the server's cap); not asking stops the reminders. */
  needsGrant(kind) {
    const plan = this.cachedPlan(kind);
    if (!plan || plan.needs_grant) return true;
    if (plan.state === 'disabled') return false;
    const at = Number((this.cache().plansAt || {})[kind]);
    if (!(at >= this.app.foregroundSince)) return true;
    const due = plan.next_due_at ? Date.parse(plan.next_due_at) : NaN;
    return Number.isFinite(due) && due <= this.now();
  }

  /** Whether a template's grant should be asked for: the cached quota's `needs_grant`
   *  (asked when nothing is cached), or a standing refusal the server holds that the
   *  settings no longer keep (the tap's report carries the setting that lifts it). */
  needsGrantOf(templateId) {
    const quota = (this.cache().quotas || []).find((q) => q.template_id === templateId);
    if (!quota) return true;
    const held = ['reject', 'ban', 'main_switch_off'].indexOf(quota.standing) >= 0;
    return Boolean(quota.needs_grant) || (held && !standingRefuses(this.subscriptionsSetting(), templateId));
  }

  getPlan(kind) {
    return this.call('GET', `/v1/reminders/${encodeURIComponent(kind)}`).then((plan) => {
      this.rememberPlan(kind, plan);
      return plan;
    });
  }

  updatePlan(kind, settings) {
    return this.call('PUT', `/v1/reminders/${encodeURIComponent(kind)}`, settings).then((plan) => {
      this.rememberPlan(kind, plan);
      return plan;
    });
  }

  quotas() {
    return this.call('GET', '/v1/grants').then((answer) => {
      this.remember((cache) => { cache.quotas = answer.quotas; });
      return answer.quotas;
    });
  }

  // ---- taps ---------------------------------------------------------------------

  /** Calls `wx.requestSubscribeMessage` now, synchronously (the Promise executor runs
   *  at once): resolves `{res}` with its success object, or `{failure}` (reported
   *  through `onError` too: `{code: 'subscribe_failed', errCode, reason, message}`). */
  subscribe(templateIds) {
    return new Promise((resolve) => {
      const failed = (err) => {
        const failure = subscribeFailure(err);
        this.report(failure);
        resolve({ res: null, failure });
      };
      try {
        this.subscribeAdapter({
          tmplIds: templateIds,
          success: (res) => resolve({ res: res || {}, failure: null }),
          fail: failed,
        });
      } catch (e) {
        failed({ errMsg: `requestSubscribeMessage threw: ${e && e.message}` });
      }
    });
  }

  report(error) {
    if (this.onError) {
      try { this.onError(error); } catch (e) { /* a listener's error is its own */ }
    }
  }

  /**
   * The check-in button. Call it first thing in the tap handler (before any `await`):
   * it records the check-in locally, asks for a grant synchronously when the cached plan
   * `needs_grant`, then submits the queue. Resolves with `{actionId, asked, result,
   * plan, queued}` — `plan` the server's answer (or the cache, when another page sent
   * the check-in), null while it waits in the queue; `error` when the server refused it
   * for good.
   */
  checkIn(kind, options) {
    const o = options || {};
    const plan = this.cachedPlan(kind);
    const templateId = (plan && plan.template_id) || this.templates[kind];
    const ask = this.asks(kind, templateId);
    // The template's refill notice (the server's pairing), asked for in the same tap:
    // the one message that tells the user their reminders ran out.
    const refillId = ask && plan && plan.refill_template_id && plan.refill_template_id !== templateId
      && this.needsGrantOf(plan.refill_template_id) ? plan.refill_template_id : null;
    const actionId = this.newId('wc_');
    const grantId = ask ? this.newId('wr_') : undefined;
    const refillRequestId = refillId ? this.newId('wr_') : undefined;
    const body = {
      action_id: actionId,
      occurred_at: new Date(this.now()).toISOString(),
      current_count: o.count,
      daily_goal: o.goal,
    };
    if (grantId) body.grant_request_id = grantId;
    const known = this.subscriptionsSetting();
    if (known) body.subscriptions_setting = known;
    // Recorded before anything else: a closed page or a dead network loses nothing. A
    // storage that refuses it (full) never stops the popup: the app keeps the action in
    // memory, submits it now, and the result says `stored: false`.
    const stored = this.enqueue({
      id: actionId, type: 'checkin', path: `/v1/reminders/${encodeURIComponent(kind)}/checkins`,
      body, templateId, awaitingTap: ask, createdAt: this.now(),
    });
    if (refillId) {
      this.enqueue({
        id: refillRequestId, type: 'grants', path: '/v1/grants',
        body: { request_id: refillRequestId }, awaitingTap: true, createdAt: this.now(),
      });
    }
    const tap = ask ? this.subscribe(refillId ? [templateId, refillId] : [templateId])
      : Promise.resolve({ res: null, failure: null });
    return tap.then(({ res, failure }) => {
      const result = res && isSubscribeResult(res[templateId]) ? res[templateId] : null;
      const refill = refillId && res && isSubscribeResult(res[refillId]) ? res[refillId] : null;
      let waiting = false;
      this.updateQueued(actionId, (item) => {
        if (!item.awaitingTap) return item;
        waiting = true;
        const next = Object.assign({}, item, { awaitingTap: false, body: Object.assign({}, item.body) });
        if (result) next.body.subscription_status = result;
        else delete next.body.grant_request_id;
        return next;
      });
      if (ask && !waiting && result) {
        // The answer came after the check-in was sent without it (a page shown again
        // after two minutes): the grant is reported on its own, by the same id.
        this.enqueueReport(grantId, { [templateId]: result });
      }
      if (refillId) this.settleRefill(refillRequestId, refillId, refill);
      // The tap's answer, too, may have been kept in memory only.
      const kept = stored && this.queueStored();
      return this.withSetting(actionId)
        .then(() => this.settle(actionId, {
          actionId, asked: ask, result, refill, subscribeError: failure, stored: kept,
        }, () => ({ plan: this.cachedPlan(kind) })));
    });
  }

  /** The refill template's answer from a check-in's tap: its queued report completed
   *  (or, dropped as stale while the popup was open, queued again by the same id), or
   *  taken off the queue when the popup gave no answer for it. */
  settleRefill(requestId, templateId, result) {
    if (!result) {
      this.dequeue(requestId);
      return;
    }
    const results = { [templateId]: result };
    const waiting = this.updateQueued(requestId, (item) => Object.assign({}, item, {
      awaitingTap: false, body: { request_id: requestId, results },
    }));
    if (!waiting) this.enqueueReport(requestId, results);
    if (result === 'accept') {
      // Held now (once the report lands): the next taps ask for the main template only.
      this.remember((cache) => {
        (cache.quotas || []).forEach((q) => {
          if (q.template_id === templateId) {
            q.available = (q.available || 0) + 1;
            q.needs_grant = false;
          }
        });
      });
    }
  }

  /**
   * A subscribe button for templates other than reminders (1–3, as WeChat allows). Call
   * it first thing in the tap handler. Reports the tap with one `request_id`, queued like
   * a check-in. Resolves with `{requestId, results, grants, queued}`.
   */
  requestGrants(templateIds) {
    if (!Array.isArray(templateIds) || templateIds.length < 1 || templateIds.length > 3) {
      return Promise.reject(new TypeError('requestGrants: 1 to 3 template ids'));
    }
    const requestId = this.newId('wr_');
    const stored = this.enqueue({
      id: requestId, type: 'grants', path: '/v1/grants',
      body: { request_id: requestId }, awaitingTap: true, createdAt: this.now(),
    });
    return this.subscribe(templateIds).then(({ res, failure }) => {
      const results = {};
      templateIds.forEach((id) => {
        if (res && isSubscribeResult(res[id])) results[id] = res[id];
      });
      if (!Object.keys(results).length) {
        this.dequeue(requestId);
        return { requestId, results, grants: null, queued: false, subscribeError: failure, stored };
      }
      const waiting = this.updateQueued(requestId, (item) => Object.assign({}, item, {
        awaitingTap: false, body: { request_id: requestId, results },
      }));
      // Dropped as stale while the popup was open: reported now, by the same id.
      if (!waiting) this.enqueueReport(requestId, results);
      const kept = stored && this.queueStored();
      return this.withSetting(requestId)
        .then(() => this.settle(requestId, { requestId, results, subscribeError: failure, stored: kept },
          () => ({ grants: null })));
    });
  }

}

Object.assign(Client.prototype, queueMethods, standingMethods, inbox);

function createClient(options) {
  return new Client(options);
}

module.exports = {
  createClient,
  Client,
  OnegrantError,
  ERROR_CODES,
  SUBSCRIBE_RESULTS,
  SUBSCRIBE_FAILURES,
  storageKeys,
  VERSION,
};
