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
  ERROR_CODES, SUBSCRIBE_RESULTS, SESSION_MARGIN_MS, STALE_TAP_MS, MAX_QUEUED_MS, DEFAULT_RETRY_AFTER_S,
  storageKeys, OnegrantError, isOnegrantError, codeOf, isSubscribeResult, defaultId, headerValue, deadline, merge,
} = require('./support.js');
const { standingRefuses, standingMethods } = require('./setting.js');
const { inbox } = require('./inbox.js');

/** Logins in flight, by session key: pages of one mini-program share one login. */
const logins = new Map();

class Client {
  /**
   * @param {object} options see onegrant.d.ts (`ClientOptions`).
   */
  constructor(options) {
    const o = options || {};
    if (!o.baseUrl) throw new TypeError('createClient: baseUrl is required');
    // eslint-disable-next-line no-undef
    const wx = o.wx || (typeof globalThis.wx !== 'undefined' ? globalThis.wx : undefined);
    const bound = (name) => (wx && typeof wx[name] === 'function' ? wx[name].bind(wx) : undefined);
    this.baseUrl = String(o.baseUrl).replace(/\/+$/, '');
    this.keys = storageKeys(this.baseUrl);
    this.storage = o.storage || wx;
    this.requestAdapter = o.request || bound('request');
    this.loginAdapter = o.login || bound('login');
    this.subscribeAdapter = o.requestSubscribeMessage || bound('requestSubscribeMessage');
    // Optional: without it (a base library before 2.10.1) no standing choice is reported.
    this.settingAdapter = o.getSetting || bound('getSetting');
    if (!this.storage || !this.requestAdapter || !this.loginAdapter || !this.subscribeAdapter) {
      throw new TypeError('createClient: no wx found; give storage, request, login and requestSubscribeMessage');
    }
    this.kinds = o.kinds || ['water'];
    this.templates = o.templates || {};
    this.timeout = o.timeout || 10000;
    this.now = o.now || (() => Date.now());
    this.newId = o.newId || ((prefix) => defaultId(prefix, this.now()));
    this.onError = o.onError || null;
    this.flushing = null;
  }

  // ---- storage -------------------------------------------------------------------

  /** A stored value, or `fallback` when the key was never set ('' from wx). A storage
   *  that fails throws: the queue is never rewritten from a failed read. */
  read(key, fallback) {
    const value = this.storage.getStorageSync(key);
    return value === '' || value === undefined || value === null ? fallback : value;
  }

  write(key, value) {
    this.storage.setStorageSync(key, value);
  }

  /** The persisted queue, oldest first (a copy). */
  queue() {
    const queue = this.read(this.keys.queue, []);
    return Array.isArray(queue) ? queue.slice() : [];
  }

  enqueue(item) {
    const queue = this.queue();
    queue.push(item);
    this.write(this.keys.queue, queue);
  }

  /** Changes the queued item `id` (read afresh: another page may have changed the
   *  queue); `change` answers the new item, or null to remove it. Whether it was there. */
  updateQueued(id, change) {
    const queue = this.queue();
    const index = queue.findIndex((item) => item.id === id);
    if (index < 0) return false;
    const item = change(queue[index]);
    if (item) queue[index] = item; else queue.splice(index, 1);
    this.write(this.keys.queue, queue);
    return true;
  }

  queued(id) {
    return this.queue().find((item) => item.id === id) || null;
  }

  dequeue(id) {
    this.updateQueued(id, () => null);
  }

  /** How many actions wait to be submitted. */
  pendingCount() {
    return this.queue().length;
  }

  cache() {
    let cache = null;
    try { cache = this.read(this.keys.cache, null); } catch (e) { cache = null; }
    return cache && typeof cache === 'object' ? cache : { quotas: [], plans: {} };
  }

  /** The plan of `kind` as last fetched (or answered to a check-in), or null. */
  cachedPlan(kind) {
    const plans = this.cache().plans || {};
    return plans[kind] || null;
  }

  /** The quotas as last fetched, or []. */
  cachedQuotas() {
    return this.cache().quotas || [];
  }

  /** Updates the cache; a cache that cannot be written is only a cache. */
  remember(change) {
    try {
      const cache = this.cache();
      change(cache);
      cache.at = this.now();
      this.write(this.keys.cache, cache);
    } catch (e) { /* the next prefetch fills it */ }
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
        fail: (err) => reject(new OnegrantError(0, 'network', (err && err.errMsg) || 'request failed')),
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
    const running = logins.get(this.keys.session);
    if (running) return running;
    const code = deadline(new Promise((resolve, reject) => {
      this.loginAdapter({
        timeout: this.timeout,
        success: (res) => resolve(res && res.code),
        fail: (err) => reject(new OnegrantError(0, 'network', (err && err.errMsg) || 'wx.login failed')),
      });
    }), this.timeout + 1000, 'wx.login');
    const login = code
      .then((c) => this.send('POST', '/v1/session', { code: c }))
      .then((answer) => {
        if (answer.status !== 200) throw Client.failure(answer);
        const expiresIn = Number(answer.data.expires_in) || 0;
        this.write(this.keys.session, { token: answer.data.token, expiresAt: this.now() + expiresIn * 1000 });
        return answer.data.token;
      })
      .catch((error) => {
        const failed = isOnegrantError(error) ? error : new OnegrantError(0, 'network', String(error));
        failed.session = true;
        throw failed;
      });
    logins.set(this.keys.session, login);
    const done = () => { logins.delete(this.keys.session); };
    login.then(done, done);
    return login;
  }

  /** An authenticated call: a 401 means one new session and one more try. */
  call(method, path, body) {
    return this.token().then((token) => this.send(method, path, body, token).then((answer) => {
      if (answer.status !== 401) return answer;
      return this.relogin(token).then((fresh) => this.send(method, path, body, fresh));
    })).then((answer) => {
      if (answer.status >= 200 && answer.status < 300) return answer.data;
      throw Client.failure(answer);
    });
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
        this.kinds.forEach((kind, i) => { if (plans[i].data) cache.plans[kind] = plans[i].data; });
      });
      const cache = this.cache();
      const fresh = Boolean(grants.data) && plans.every((p) => p.data);
      return { quotas: cache.quotas || [], plans: cache.plans || {}, fresh };
    });
  }

  /** Whether a check-in of `kind` should ask for a grant: the server's `needs_grant`, as
   *  cached; asked when nothing is cached yet. */
  needsGrant(kind) {
    const plan = this.cachedPlan(kind);
    return plan ? Boolean(plan.needs_grant) : true;
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
      this.remember((cache) => { cache.plans = cache.plans || {}; cache.plans[kind] = plan; });
      return plan;
    });
  }

  updatePlan(kind, settings) {
    return this.call('PUT', `/v1/reminders/${encodeURIComponent(kind)}`, settings).then((plan) => {
      this.remember((cache) => { cache.plans = cache.plans || {}; cache.plans[kind] = plan; });
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
   *  at once): resolves with its success object, or null when it failed. */
  subscribe(templateIds) {
    return new Promise((resolve) => {
      this.subscribeAdapter({
        tmplIds: templateIds,
        success: (res) => resolve(res || {}),
        fail: (err) => {
          this.report({ code: 'subscribe_failed', message: (err && err.errMsg) || 'requestSubscribeMessage failed' });
          resolve(null);
        },
      });
    });
  }

  report(error) {
    if (this.onError) {
      try { this.onError(error); } catch (e) { /* a listener's error is its own */ }
    }
  }

  /** Queues a grant report (`POST /v1/grants`) for a tap's `results`, by `requestId`. */
  enqueueReport(requestId, results) {
    if (this.queued(requestId)) return;
    this.enqueue({
      id: requestId, type: 'grants', path: '/v1/grants',
      body: { request_id: requestId, results }, awaitingTap: false, createdAt: this.now(),
    });
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
    // Recorded before anything else: a closed page or a dead network loses nothing.
    this.enqueue({
      id: actionId, type: 'checkin', path: `/v1/reminders/${encodeURIComponent(kind)}/checkins`,
      body, templateId, awaitingTap: ask, createdAt: this.now(),
    });
    if (refillId) {
      this.enqueue({
        id: refillRequestId, type: 'grants', path: '/v1/grants',
        body: { request_id: refillRequestId }, awaitingTap: true, createdAt: this.now(),
      });
    }
    const tap = ask ? this.subscribe(refillId ? [templateId, refillId] : [templateId]) : Promise.resolve(null);
    return tap.then((res) => {
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
      return this.withSetting(actionId)
        .then(() => this.settle(actionId, { actionId, asked: ask, result, refill }, () => ({ plan: this.cachedPlan(kind) })));
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
    this.enqueue({
      id: requestId, type: 'grants', path: '/v1/grants',
      body: { request_id: requestId }, awaitingTap: true, createdAt: this.now(),
    });
    return this.subscribe(templateIds).then((res) => {
      const results = {};
      templateIds.forEach((id) => {
        if (res && isSubscribeResult(res[id])) results[id] = res[id];
      });
      if (!Object.keys(results).length) {
        this.dequeue(requestId);
        return { requestId, results, grants: null, queued: false };
      }
      const waiting = this.updateQueued(requestId, (item) => Object.assign({}, item, {
        awaitingTap: false, body: { request_id: requestId, results },
      }));
      // Dropped as stale while the popup was open: reported now, by the same id.
      if (!waiting) this.enqueueReport(requestId, results);
      return this.withSetting(requestId)
        .then(() => this.settle(requestId, { requestId, results }, () => ({ grants: null })));
    });
  }

  /** Submits the queue and answers for action `id`: the server's answer, or (sent by
   *  another page meanwhile) `elsewhere()`, or still queued. */
  settle(id, base, elsewhere) {
    return this.flush().then((flushed) => {
      const answer = flushed.answers[id];
      const result = Object.assign({}, base);
      if (answer && answer.error) {
        result.error = answer.error;
        result.queued = false;
      } else if (answer) {
        Object.assign(result, base.actionId ? { plan: answer.data } : { grants: answer.data.grants });
        result.queued = false;
      } else if (this.queued(id)) {
        Object.assign(result, base.actionId ? { plan: null } : { grants: null });
        result.queued = true;
      } else {
        Object.assign(result, elsewhere());
        result.queued = false;
      }
      return result;
    });
  }

  // ---- the queue ----------------------------------------------------------------

  /**
   * Submits every queued action, oldest first, each with the ids it was given when it
   * was recorded. 2xx and definite 4xx take an item off the queue (a 4xx is surfaced
   * through `onError` and the answer, never retried; a refused check-in's accepted grant
   * is still reported); no answer, 429 or 5xx stop the run and keep the rest, and a
   * `Retry-After` holds the next run back until then. One run at a time per client; a
   * flush asked for while one runs runs after it. Resolves with `{answers: {id: {data} |
   * {error}}, pending}`.
   */
  flush() {
    if (this.flushing) {
      return this.flushing.then((first) => this.flush().then((second) => merge(first, second)));
    }
    const answers = {};
    const run = () => {
      const now = this.now();
      const retryAt = Number(this.read(this.keys.retryAt, 0)) || 0;
      if (now < retryAt) return Promise.resolve();
      const item = this.queue().find((i) => !i.awaitingTap || now - i.createdAt > STALE_TAP_MS);
      if (!item) return Promise.resolve();
      if (now - item.createdAt > MAX_QUEUED_MS) {
        const error = new OnegrantError(0, 'expired', 'queued longer than the server remembers its ids');
        answers[item.id] = { error };
        this.dequeue(item.id);
        this.report(error);
        return run();
      }
      if (item.awaitingTap) {
        // The page closed with the popup open: the tap's answer is lost; the action is
        // sent without the grant it may have carried (a late answer is reported apart).
        this.updateQueued(item.id, (queued) => {
          if (queued.type === 'grants') return null;
          const next = Object.assign({}, queued, { awaitingTap: false, body: Object.assign({}, queued.body) });
          delete next.body.grant_request_id;
          return next;
        });
        return run();
      }
      return this.call('POST', item.path, item.body).then((data) => {
        answers[item.id] = { data };
        this.dequeue(item.id);
        this.afterAnswer(item, data);
        return run();
      }, (error) => {
        if (isOnegrantError(error) && !error.retryable && !error.session) {
          answers[item.id] = { error };
          this.dequeue(item.id);
          this.keepGrant(item, error);
          this.report(error);
          return run();
        }
        if (isOnegrantError(error) && (error.status === 429 || error.status === 503)) {
          const wait = error.retryAfter || DEFAULT_RETRY_AFTER_S;
          this.write(this.keys.retryAt, this.now() + wait * 1000);
        }
        // Stays queued, ids unchanged: the next flush sends it again.
        return undefined;
      });
    };
    const flushing = run().then(() => ({ answers, pending: this.pendingCount() }));
    this.flushing = flushing;
    const done = () => { if (this.flushing === flushing) this.flushing = null; };
    flushing.then(done, done);
    return flushing;
  }

  /** A check-in refused for good still carried a grant WeChat counted: reported alone,
   *  by its own id (unless the grant itself was what the server refused). */
  keepGrant(item, error) {
    const grant = item.type === 'checkin' && item.body.grant_request_id && item.body.subscription_status;
    if (!grant || !item.templateId || ['invalid_grant', 'grant_limit'].indexOf(error.code) >= 0) return;
    this.enqueueReport(item.body.grant_request_id, { [item.templateId]: item.body.subscription_status });
  }

  /** Keeps the cache as the server last answered. */
  afterAnswer(item, data) {
    if (item.type === 'checkin' && data && data.kind) {
      this.remember((cache) => { cache.plans = cache.plans || {}; cache.plans[data.kind] = data; });
    } else if (item.type === 'grants' && data && data.quotas) {
      this.remember((cache) => { cache.quotas = data.quotas; });
    }
  }
}

Object.assign(Client.prototype, standingMethods, inbox);

function createClient(options) {
  return new Client(options);
}

module.exports = {
  createClient,
  Client,
  OnegrantError,
  ERROR_CODES,
  SUBSCRIBE_RESULTS,
  storageKeys,
  VERSION,
};
