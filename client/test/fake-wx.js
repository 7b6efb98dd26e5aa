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
  }

  getStorageSync(key) {
    // wx answers '' for a key never set, and a copy, never the stored object.
    return this.store.has(key) ? structuredClone(this.store.get(key)) : '';
  }

  setStorageSync(key, value) {
    this.store.set(key, structuredClone(value));
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

module.exports = { FakeWx };
