'use strict';
/**
 * The offline queue, mixed into `Client.prototype` by `onegrant.js`: every action is
 * stored before anything else with its ids made once, and submitted oldest first with
 * those ids until the server answers 2xx or a definite 4xx.
 *
 * One flush per app: the queue is shared by every page (one storage), and so is its
 * flush (`storage.js`'s app state): a page asking while another page's flush runs
 * waits for it and runs after it, so no action is submitted twice at once or out of
 * order. Submits are tried again when a `Retry-After` ends, when the network comes back
 * (`wx.onNetworkStatusChange`) and when the app is shown again (`wx.onAppShow`), not
 * only on the next tap.
 */

const {
  STALE_TAP_MS, MAX_QUEUED_MS, DEFAULT_RETRY_AFTER_S, MAX_RETRY_WAIT_MS, MAX_QUEUE,
  OnegrantError, isOnegrantError, merge,
} = require('./support.js');
const { load, save, loadQueue, saveQueue } = require('./storage.js');

/** How many recent answers the app keeps, for a page whose action another page sent. */
const RECENT_ANSWERS = 50;

const ACCEPTS = ['accept', 'acceptWithAudio', 'acceptWithAlert'];

/** Whether a queued action carries a grant the user accepted. */
function carriesGrant(item) {
  const body = (item && item.body) || {};
  if (item && item.type === 'checkin') {
    return Boolean(body.grant_request_id) && ACCEPTS.indexOf(body.subscription_status) >= 0;
  }
  return Object.keys(body.results || {}).some((id) => ACCEPTS.indexOf(body.results[id]) >= 0);
}

const queueMethods = {
  /** The queue, oldest first (a copy). Never throws. */
  queue() {
    return loadQueue(this.storage, this.app, this.keys.queue).items;
  },

  /** Applies `change` to the queue read afresh (another page may have changed it);
   *  answers `change`'s result and whether the queue is stored. Never throws. */
  changeQueue(change) {
    const { items, whole } = loadQueue(this.storage, this.app, this.keys.queue);
    const result = change(items);
    const stored = saveQueue(this.storage, this.app, this.keys.queue, items, whole);
    return { result, stored };
  },

  /** Adds `item` at the end; past MAX_QUEUE the oldest actions are dropped, counted and
   *  reported (`dropped`). Whether it is stored: if not, the app keeps it in memory and
   *  submits it while it lives, and `onError` hears `not_stored`. */
  enqueue(item) {
    const { result: dropped, stored } = this.changeQueue((items) => {
      items.push(item);
      const gone = [];
      while (items.length > MAX_QUEUE) {
        // The oldest first, but never one carrying a grant the user accepted while
        // any without one is left: a dropped check-in loses a count, a dropped grant
        // a message.
        const plain = items.findIndex((i) => !carriesGrant(i));
        gone.push(items.splice(plain >= 0 && plain < items.length - 1 ? plain : 0, 1)[0]);
      }
      return gone;
    });
    if (dropped.length) {
      this.app.dropped += dropped.length;
      this.report(new OnegrantError(0, 'dropped',
        `the queue holds ${MAX_QUEUE} actions: the oldest ${dropped.length} dropped`));
    }
    if (!stored) {
      this.report(new OnegrantError(0, 'not_stored',
        'the storage refused the action: kept in memory and submitted now, lost if the app is closed first'));
    }
    return stored;
  },

  /** Changes the queued item `id`; `change` answers the new item, or null to remove
   *  it. Whether it was there. */
  updateQueued(id, change) {
    return this.changeQueue((items) => {
      const index = items.findIndex((item) => item.id === id);
      if (index < 0) return false;
      const item = change(items[index]);
      if (item) items[index] = item; else items.splice(index, 1);
      return true;
    }).result;
  },

  queued(id) {
    return this.queue().find((item) => item.id === id) || null;
  },

  dequeue(id) {
    this.updateQueued(id, () => null);
  },

  /** Whether the queue as it stands is in storage (not only in this app run's memory). */
  queueStored() {
    return !this.app.memory.has(this.keys.queue);
  },

  /** How many actions wait to be submitted. */
  pendingCount() {
    return this.queue().length;
  },

  /** How many queued actions this app run dropped because the queue was full. */
  droppedCount() {
    return this.app.dropped;
  },

  /** The configuration error (`url not in domain list`, TLS) that stopped this app
   *  run's submits, or null. The queue is kept; the next app launch tries again. */
  configurationError() {
    return this.app.misconfigured.get(this.keys.queue) || null;
  },

  /** Queues a grant report (`POST /v1/grants`) for a tap's `results`, by `requestId`. */
  enqueueReport(requestId, results) {
    if (this.queued(requestId)) return;
    this.enqueue({
      id: requestId, type: 'grants', path: '/v1/grants',
      body: { request_id: requestId, results }, awaitingTap: false, createdAt: this.now(),
    });
  },

  /** Submits the queue and answers for action `id`: the server's answer (this page's
   *  flush or another's), or still queued, or `elsewhere()` (sent, answer unknown). */
  settle(id, base, elsewhere) {
    return this.flush().then((flushed) => {
      const answer = flushed.answers[id] || this.recentAnswers().get(id);
      const result = Object.assign({}, base);
      if (answer && answer.error) {
        result.error = answer.error;
        result.queued = false;
      } else if (answer) {
        const data = answer.data || {};
        Object.assign(result, base.actionId ? { plan: answer.data || null } : { grants: data.grants || null });
        result.queued = false;
      } else if (this.queued(id)) {
        Object.assign(result, base.actionId ? { plan: null } : { grants: null });
        result.queued = true;
        // Why it waits, when nothing will send it in this app run.
        const stopped = this.configurationError();
        if (stopped) result.configurationError = stopped;
      } else {
        Object.assign(result, elsewhere());
        result.queued = false;
      }
      return result;
    });
  },

  recentAnswers() {
    const key = this.keys.queue;
    if (!this.app.answers.has(key)) this.app.answers.set(key, new Map());
    return this.app.answers.get(key);
  },

  /**
   * Submits every queued action, oldest first and in order, each with the ids it was
   * given when it was recorded. 2xx and definite 4xx take an item off the queue (a 4xx
   * is surfaced through `onError` and the answer, never retried; a refused check-in's
   * accepted grant is still reported); no answer, 429 or 5xx stop the run and keep the
   * rest, and a `Retry-After` holds the next run back until then (and schedules it). A
   * configuration error stops this app run's submits and is reported at once. An
   * action whose popup is still open holds back those after it. One run at a time per
   * app; a flush asked for while one runs runs after it. Resolves with `{answers: {id:
   * {data} | {error}}, pending}`.
   */
  flush() {
    const key = this.keys.queue;
    const running = this.app.flushes.get(key);
    if (running) {
      // Every caller arriving during a run shares one run after it — none at all when
      // that run stopped on a failure (trying again at once would only fail again).
      let followUp = this.app.followUps.get(key);
      if (!followUp) {
        followUp = running.then((first) => (first.stopped ? first : this.flush()), () => this.flush());
        this.app.followUps.set(key, followUp);
        const clear = () => { if (this.app.followUps.get(key) === followUp) this.app.followUps.delete(key); };
        followUp.then(clear, clear);
      }
      return Promise.all([running.catch(() => ({ answers: {}, pending: 0 })), followUp])
        .then(([first, second]) => merge(first, second));
    }
    let stopped = false;
    const answers = {};
    const answered = (id, answer) => {
      answers[id] = answer;
      const recent = this.recentAnswers();
      recent.delete(id);
      recent.set(id, answer);
      if (recent.size > RECENT_ANSWERS) recent.delete(recent.keys().next().value);
    };
    const run = () => {
      if (this.app.misconfigured.has(key)) return Promise.resolve();
      const now = this.now();
      const retryAt = Number(load(this.storage, this.app, this.keys.retryAt, 0)) || 0;
      // A retryAt further off than any server asks was written by a clock since set back.
      if (now < retryAt && retryAt - now <= MAX_RETRY_WAIT_MS) {
        this.flushIn(retryAt - now);
        return Promise.resolve();
      }
      const { items, whole } = loadQueue(this.storage, this.app, this.keys.queue);
      // While stored actions cannot be read, newer ones wait: order is what keeps a
      // refusal after the accept it followed.
      if (!whole) return Promise.resolve();
      const item = items[0];
      if (!item) return Promise.resolve();
      if (now - item.createdAt > MAX_QUEUED_MS) {
        const error = new OnegrantError(0, 'expired', 'queued longer than the server remembers its ids');
        answered(item.id, { error });
        this.dequeue(item.id);
        this.report(error);
        return run();
      }
      if (item.awaitingTap) {
        // Its popup is open: it and what follows wait, in order (the tap flushes; a tap
        // from a run that was killed is sent without its grant once stale).
        if (now - item.createdAt <= STALE_TAP_MS) {
          this.flushIn(STALE_TAP_MS - (now - item.createdAt));
          return Promise.resolve();
        }
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
      return this.callAnswer('POST', item.path, item.body).then(({ data, replayed }) => {
        answered(item.id, { data });
        this.dequeue(item.id);
        this.afterAnswer(item, data, replayed);
        return run();
      }, (error) => {
        if (isOnegrantError(error) && error.code === 'configuration') {
          this.misconfigured(error);
          stopped = true;
          return undefined;
        }
        if (isOnegrantError(error) && !error.retryable && !error.session) {
          answered(item.id, { error });
          this.dequeue(item.id);
          this.keepGrant(item, error);
          this.report(error);
          return run();
        }
        if (isOnegrantError(error) && (error.status === 429 || error.status === 503)) {
          const wait = Math.min((error.retryAfter || DEFAULT_RETRY_AFTER_S) * 1000, MAX_RETRY_WAIT_MS);
          save(this.storage, this.app, this.keys.retryAt, this.now() + wait);
          this.flushIn(wait);
        }
        // A session that cannot be had for a reason other than the network (a login
        // code refused, a token refused again) is reported, once per app run.
        if (isOnegrantError(error) && error.session && !(error.status === 0 && error.code === 'network')) {
          this.reportOnce(error);
        }
        // Stays queued, ids unchanged: the next flush sends it again.
        stopped = true;
        return undefined;
      });
    };
    const flushing = Promise.resolve().then(run)
      .then(() => ({ answers, pending: this.pendingCount(), stopped }));
    this.app.flushes.set(key, flushing);
    const done = () => { if (this.app.flushes.get(key) === flushing) this.app.flushes.delete(key); };
    flushing.then(done, done);
    return flushing;
  },

  /** Reports `error` unless one of its code was reported in this app run. */
  reportOnce(error) {
    const seen = `${this.keys.queue} ${error.code}`;
    if (this.app.reported.has(seen)) return;
    this.app.reported.add(seen);
    this.report(error);
  },

  /** A flush whose failure is only logged in the queue (for timers and platform events). */
  flushSoon() {
    this.flush().catch(() => null);
  },

  /** Flushes again in `ms` (a Retry-After ending): one timer per queue. */
  flushIn(ms) {
    const key = this.keys.queue;
    clearTimeout(this.app.timers.get(key));
    const timer = setTimeout(() => {
      this.app.timers.delete(key);
      this.flushSoon();
    }, ms + 100);
    // Node (the tests) need not wait for it; a mini-program has no such method.
    if (timer && typeof timer.unref === 'function') timer.unref();
    this.app.timers.set(key, timer);
  },

  /** The platform's events, heard once per app: app show starts a new foreground
   *  session (cached plans from before it are stale) and flushes every queue; the
   *  network coming back flushes every queue. */
  listen(wx) {
    const app = this.app;
    // The newest page's client answers the app's events (its onError hears them).
    app.clients.set(this.keys.queue, this);
    if (app.hooked || !wx) return;
    app.hooked = true;
    // A TLS error can be a captive portal or a wrong clock: a new network or an app
    // shown again lifts it for one more try. A domain missing from the request
    // domains is a release's configuration: it holds until the next launch.
    const flushAll = () => app.clients.forEach((client, key) => {
      const stop = app.misconfigured.get(key);
      if (stop && !stop.domain) app.misconfigured.delete(key);
      client.flushSoon();
    });
    if (typeof wx.onAppShow === 'function') {
      wx.onAppShow(() => {
        app.foregroundSince = this.now();
        flushAll();
      });
    }
    if (typeof wx.onNetworkStatusChange === 'function') {
      wx.onNetworkStatusChange((res) => { if (res && res.isConnected) flushAll(); });
    }
  },

  /** A check-in refused for good still carried a grant WeChat counted: reported alone,
   *  by its own id (unless the grant itself was what the server refused). */
  keepGrant(item, error) {
    const grant = item.type === 'checkin' && item.body.grant_request_id && item.body.subscription_status;
    if (!grant || !item.templateId || ['invalid_grant', 'grant_limit'].indexOf(error.code) >= 0) return;
    this.enqueueReport(item.body.grant_request_id, { [item.templateId]: item.body.subscription_status });
  },

  /** Keeps the cache as the server last answered. A check-in answered again (its id
   *  applied before: an action sent twice, or one whose answer was lost) carries the
   *  plan as it was then: not cached, and the plan cached is no longer taken as fresh
   *  (the next tap asks, the next prefetch reads it again). */
  afterAnswer(item, data, replayed) {
    if (item.type === 'checkin' && data && data.kind && replayed) {
      this.remember((cache) => {
        if (cache.plansAt) delete cache.plansAt[data.kind];
      });
    } else if (item.type === 'checkin' && data && data.kind) {
      this.rememberPlan(data.kind, data);
    } else if (item.type === 'grants' && data && data.quotas) {
      this.remember((cache) => { cache.quotas = data.quotas; });
    }
  },
};

module.exports = { queueMethods, RECENT_ANSWERS };
