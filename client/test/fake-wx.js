'use strict';
// A wx for Node: storage in a Map (shared by the "pages" given the same one), the tap
// gesture rule as WeChat enforces it, and request/login adapters the tests choose (the
// real local stack over HTTP in the integration tests).

class FakeWx {
  constructor(options) {
    const o = options || {};
    this.store = o.store || new Map();
    this.decisions = o.decisions || {};
    this.requestImpl = o.request || ((opts) => setTimeout(() => opts.fail({ errMsg: 'request:fail offline' }), 0));
    this.loginImpl = o.login || ((opts) => setTimeout(() => opts.fail({ errMsg: 'login:fail offline' }), 0));
    this.inGesture = false;
    this.subscribeCalls = [];
    // wx.getSetting's subscriptionsSetting ({mainSwitch, itemSettings}); undefined: the
    // answer carries none (a base library before 2.10.1). `settingFails`: it fails.
    this.subscriptionsSetting = o.subscriptionsSetting;
    this.settingFails = Boolean(o.settingFails);
    // `settingHangs`: no answer until `answerSetting()` (an app killed meanwhile).
    this.settingHangs = Boolean(o.settingHangs);
    this.settingReads = 0;
    // `subscribeFails`: {errCode, errMsg} every popup fails with (20004: main switch off).
    this.subscribeFails = o.subscribeFails || null;
    // Storage as WeChat limits it: `storageLimit` bytes for the whole app (the host
    // app's data counts), 1 MB per key; `readFails` makes every read throw.
    this.storageLimit = o.storageLimit === undefined ? 10 * 1024 * 1024 : o.storageLimit;
    this.readFails = false;
    this.storageWrites = 0;
    // wx.onAppShow and wx.onNetworkStatusChange listeners (`appShow()`, `network(on)`).
    this.showListeners = [];
    this.networkListeners = [];
  }

  getStorageSync(key) {
    if (this.readFails) throw new Error('getStorageSync:fail');
    // wx answers '' for a key never set, and a copy, never the stored object.
    return this.store.has(key) ? structuredClone(this.store.get(key)) : '';
  }

  setStorageSync(key, value) {
    const size = (v) => JSON.stringify(v === undefined ? null : v).length;
    if (size(value) > 1024 * 1024) throw new Error('setStorageSync:fail exceed storage item max length');
    let total = size(value);
    for (const [k, v] of this.store) if (k !== key) total += size(v);
    if (total > this.storageLimit) throw new Error('setStorageSync:fail exceed storage max size 10MB');
    this.storageWrites += 1;
    this.store.set(key, structuredClone(value));
  }

  onAppShow(listener) {
    this.showListeners.push(listener);
  }

  onNetworkStatusChange(listener) {
    this.networkListeners.push(listener);
  }

  /** The app comes back to the foreground. */
  appShow() {
    this.showListeners.forEach((l) => l({ path: 'pages/water/index', scene: 1014 }));
  }

  /** The network goes away or comes back. */
  network(isConnected) {
    this.networkListeners.forEach((l) => l({ isConnected, networkType: isConnected ? 'wifi' : 'none' }));
  }

  /** A tap: `handler` runs inside the gesture only until its first await returns. */
  tap(handler) {
    this.inGesture = true;
    try {
      return handler();
    } finally {
      this.inGesture = false;
    }
  }

  requestSubscribeMessage(options) {
    const inGesture = this.inGesture;
    this.subscribeCalls.push({ tmplIds: options.tmplIds, inGesture });
    // A popup the test answers itself, later (`answer(decision)`).
    if (this.holdPopups) {
      this.held = (decision) => {
        const res = { errMsg: 'requestSubscribeMessage:ok' };
        for (const id of options.tmplIds) res[id] = decision;
        options.success(res);
      };
      return;
    }
    setTimeout(() => {
      if (this.subscribeFails) {
        options.fail(Object.assign({ errMsg: 'requestSubscribeMessage:fail' }, this.subscribeFails));
        return;
      }
      if (!inGesture) {
        options.fail({ errMsg: 'requestSubscribeMessage:fail can only be invoked by user TAP gesture.' });
        return;
      }
      const res = { errMsg: 'requestSubscribeMessage:ok' };
      for (const id of options.tmplIds) res[id] = this.decisions[id] || 'accept';
      options.success(res);
    }, 5);
  }

  request(options) {
    this.requestImpl(options);
  }

  login(options) {
    this.loginImpl(options);
  }

  getSetting(options) {
    if (!options || options.withSubscriptions !== true) {
      throw new Error('wx.getSetting without withSubscriptions: quota comes from the server');
    }
    this.settingReads += 1;
    // A copy of the setting as it is when asked (a test may change it meanwhile).
    const setting = this.subscriptionsSetting === undefined ? undefined : structuredClone(this.subscriptionsSetting);
    const answer = () => {
      if (this.settingFails) options.fail({ errMsg: 'getSetting:fail' });
      else options.success({ authSetting: {}, ...(setting ? { subscriptionsSetting: setting } : {}) });
    };
    if (this.settingHangs) this.answerSetting = answer;
    else setTimeout(answer, 1);
  }
}

/** Caches `plans` (and `quotas`) for `client` as a prefetch in this foreground session
 *  would have: fetched now. */
function cachePlans(wx, client, plans, quotas) {
  const plansAt = {};
  for (const kind of Object.keys(plans)) plansAt[kind] = client.now();
  wx.setStorageSync(client.keys.cache, { quotas: quotas || [], plans, plansAt });
}

/** A scripted server for the queue's rules: `answer(method, path, body)` gives
 *  `{status, data, header, delay}`, `{fail: errMsg}` (wx.request's fail), or null for
 *  no answer at all. Every request is logged. */
function scripted(answer) {
  const log = [];
  const request = (o) => {
    const path = o.url.replace(/^https?:\/\/[^/]+/, '');
    log.push({ method: o.method, path, body: o.data, auth: o.header && o.header.Authorization });
    const res = answer(o.method, path, o.data);
    setTimeout(() => {
      if (!res) o.fail({ errMsg: 'request:fail' });
      else if (res.fail) o.fail({ errMsg: res.fail });
      else o.success({ statusCode: res.status, data: res.data, header: res.header || {} });
    }, (res && res.delay) || 0);
  };
  return { log, request };
}

module.exports = { FakeWx, cachePlans, scripted };
