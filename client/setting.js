'use strict';
/**
 * The user's standing choice (总是保持以上选择) as `wx.getSetting({withSubscriptions:
 * true})` tells it: read into the client's cache at `prefetch` and again just after a
 * tap (the popup may have just kept a choice), and reported with the next check-in or
 * grant report as `subscriptions_setting` — the server pauses the template's plans
 * while the main switch is off or a kept `reject`/`ban` makes asking pointless, and
 * says so in `pause_reason`. The helpers are pure; `standingMethods` are the client's
 * methods for it.
 */

/** The pause reasons of a standing choice: the server stops asking (needs_grant false)
 *  until the user changes the setting (`wx.openSetting`). */
const STANDING_REASONS = Object.freeze(['always_rejected', 'always_banned', 'main_switch_off']);

/** How long a `wx.getSetting` may take before the action goes on without it. */
const SETTING_TIMEOUT_MS = 2000;

/** `subscriptionsSetting` in the API's shape (`{main_switch, item_settings}`), or null
 *  when WeChat gave none (a base library before 2.10.1). Values other than WeChat's
 *  four are left out: the server refuses them. */
function toReported(subscriptionsSetting) {
  const s = subscriptionsSetting;
  if (!s || typeof s !== 'object' || typeof s.mainSwitch !== 'boolean') return null;
  const items = {};
  Object.keys(s.itemSettings || {}).slice(0, 50).forEach((id) => {
    const value = s.itemSettings[id];
    if (['accept', 'reject', 'ban', 'filter'].indexOf(value) >= 0) items[id] = value;
  });
  return { main_switch: s.mainSwitch, item_settings: items };
}

/** Reads the setting through the `wx.getSetting`-shaped `adapter`: resolves the
 *  reported shape stamped with when it was read (`read_at`, from `now()`: the server
 *  applies settings in the order they were read, so one read earlier that arrives
 *  later changes nothing), or null (no adapter, a failure, no answer in time). Never
 *  rejects. */
function readSetting(adapter, now) {
  const clock = now || (() => Date.now());
  if (!adapter) return Promise.resolve(null);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), SETTING_TIMEOUT_MS);
    const done = (value) => { clearTimeout(timer); resolve(value); };
    try {
      adapter({
        withSubscriptions: true,
        success: (res) => {
          const setting = toReported(res && res.subscriptionsSetting);
          if (setting) setting.read_at = new Date(clock()).toISOString();
          done(setting);
        },
        fail: () => done(null),
      });
    } catch (e) {
      done(null);
    }
  });
}

/** The standing choice `setting` keeps for `templateId`: 'main_switch_off', 'accept',
 *  'reject', 'ban', or null (none kept, or the setting unknown). */
function standingOf(setting, templateId) {
  if (!setting) return null;
  if (!setting.main_switch) return 'main_switch_off';
  const item = (setting.item_settings || {})[templateId];
  return ['accept', 'reject', 'ban'].indexOf(item) >= 0 ? item : null;
}

/** Whether asking for `templateId` is pointless under `setting` (WeChat would answer
 *  without a popup, or fail with 20004). */
function standingRefuses(setting, templateId) {
  return ['main_switch_off', 'reject', 'ban'].indexOf(standingOf(setting, templateId)) >= 0;
}

/** The client's standing-choice methods, mixed into `Client.prototype` by
 *  `onegrant.js` (they use its cache, `cachedPlan`, `needsGrant` and queue). */
const standingMethods = {
  /** Whether a check-in of `kind` (template `templateId`) asks for a grant: never while
   *  the user's settings keep a refusing choice for it (no popup would show, or 20004);
   *  else the server's `needs_grant`, or a plan the server paused for a standing choice
   *  the settings no longer keep (the tap's silent accept, reported with the setting,
   *  resumes it). */
  asks(kind, templateId) {
    if (!templateId || standingRefuses(this.subscriptionsSetting(), templateId)) return false;
    const plan = this.cachedPlan(kind);
    return this.needsGrant(kind) || Boolean(plan && STANDING_REASONS.indexOf(plan.pause_reason) >= 0);
  },

  /** subscriptionsSetting as last read, as reported (`{main_switch, item_settings}`), or null. */
  subscriptionsSetting() {
    return this.cache().setting || null;
  },

  /** The standing choice the user's settings keep for `templateId`: 'accept', 'reject',
   *  'ban', 'main_switch_off', or null. A refusing one is the page's cue to guide the
   *  user to `wx.openSetting({withSubscriptions: true})`. */
  standingOf(templateId) {
    return standingOf(this.subscriptionsSetting(), templateId);
  },

  /** Reads the setting again into the cache; resolves it (else the cached one). */
  refreshSetting() {
    return readSetting(this.settingAdapter, this.now).then((setting) => {
      if (setting) this.remember((cache) => { cache.setting = setting; });
      return setting || this.subscriptionsSetting();
    });
  },

  /** The setting read again (a popup may have just kept a choice) and added to the
   *  queued action `id`, if it is still queued: the tap's answer is stored first. */
  withSetting(id) {
    return this.refreshSetting().then((setting) => {
      if (!setting) return;
      this.updateQueued(id, (item) => Object.assign({}, item, {
        body: Object.assign({}, item.body, { subscriptions_setting: setting }),
      }));
    });
  },
};

module.exports = {
  STANDING_REASONS, SETTING_TIMEOUT_MS, toReported, readSetting, standingOf, standingRefuses, standingMethods,
};
