'use strict';
// The standing choice with a fake wx and no network: each itemSettings case decides
// whether a tap asks, the setting read again after the popup is what the check-in
// reports, and a plan paused for a standing choice the settings no longer keep asks.

const test = require('node:test');
const assert = require('node:assert/strict');
const { createClient } = require('../onegrant.js');
const { toReported, standingOf } = require('../setting.js');
const { FakeWx, cachePlans } = require('./fake-wx.js');

const WATER = 'tmpl_water_reminder';
const ORDER = 'tmpl_order_status';

/** The client's clock in these tests: a setting read is stamped with it. */
const NOW = Date.parse('2026-12-06T05:00:00.000Z');

/** `setting` as the client reports it: stamped with when it was read. */
function read(setting, at = NOW) {
  return Object.assign({}, setting, { read_at: new Date(at).toISOString() });
}

function client(wx, plan) {
  const c = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER }, now: () => NOW });
  cachePlans(wx, c, { water: plan });
  return c;
}

const needing = { kind: 'water', template_id: WATER, needs_grant: true, pause_reason: 'needs_grant' };

/** The check-in of one tap, after the client read the setting (as `prefetch` does). */
async function tapCheckIn(wx, c) {
  await c.refreshSetting();
  const result = await wx.tap(() => c.checkIn('water', { count: 1, goal: 8 }));
  const [queued] = wx.getStorageSync(c.keys.queue);
  return { result, body: queued.body };
}

test('each itemSettings case: a refusing one skips the popup, and the check-in reports the setting', async () => {
  const cases = [
    // [subscriptionsSetting, asks, standing, reported]
    [{ mainSwitch: true }, true, null, read({ main_switch: true, item_settings: {} })],
    [{ mainSwitch: true, itemSettings: { [WATER]: 'accept' } }, true, 'accept',
      read({ main_switch: true, item_settings: { [WATER]: 'accept' } })],
    [{ mainSwitch: true, itemSettings: { [WATER]: 'reject', [ORDER]: 'accept' } }, false, 'reject',
      read({ main_switch: true, item_settings: { [WATER]: 'reject', [ORDER]: 'accept' } })],
    [{ mainSwitch: true, itemSettings: { [WATER]: 'ban' } }, false, 'ban',
      read({ main_switch: true, item_settings: { [WATER]: 'ban' } })],
    [{ mainSwitch: true, itemSettings: { [WATER]: 'filter', [ORDER]: 'reject' } }, true, null,
      read({ main_switch: true, item_settings: { [WATER]: 'filter', [ORDER]: 'reject' } })],
    [{ mainSwitch: false, itemSettings: { [WATER]: 'accept' } }, false, 'main_switch_off',
      read({ main_switch: false, item_settings: { [WATER]: 'accept' } })],
  ];
  for (const [setting, asks, standing, reported] of cases) {
    const wx = new FakeWx({ subscriptionsSetting: setting });
    const c = client(wx, needing);
    const { result, body } = await tapCheckIn(wx, c);
    const label = JSON.stringify(setting);
    assert.equal(result.asked, asks, label);
    assert.equal(wx.subscribeCalls.length, asks ? 1 : 0, label);
    assert.equal(c.standingOf(WATER), standing, label);
    assert.deepEqual(body.subscriptions_setting, reported, label);
    assert.equal(body.grant_request_id !== undefined, asks, label);
  }
});

test('the setting read again after the popup is the one reported: a choice kept in this very tap', async () => {
  const wx = new FakeWx({ subscriptionsSetting: { mainSwitch: true }, decisions: { [WATER]: 'reject' } });
  const c = client(wx, needing);
  await c.refreshSetting();
  // The user ticks "always keep" and rejects in this popup.
  const checkedIn = wx.tap(() => c.checkIn('water', { count: 1, goal: 8 }));
  wx.subscriptionsSetting = { mainSwitch: true, itemSettings: { [WATER]: 'reject' } };
  const result = await checkedIn;
  assert.equal(result.result, 'reject');
  const [queued] = wx.getStorageSync(c.keys.queue);
  assert.deepEqual(queued.body.subscriptions_setting, read({ main_switch: true, item_settings: { [WATER]: 'reject' } }));
  assert.equal(queued.body.subscription_status, 'reject');
  assert.equal(c.standingOf(WATER), 'reject');
  // The next tap shows no popup.
  await wx.tap(() => c.checkIn('water', { count: 2, goal: 8 }));
  assert.equal(wx.subscribeCalls.length, 1);
});

test('a plan paused for a standing choice the settings no longer keep asks, so its silent accept resumes it', async () => {
  const paused = { kind: 'water', template_id: WATER, needs_grant: false, pause_reason: 'always_rejected' };
  const lifted = new FakeWx({ subscriptionsSetting: { mainSwitch: true, itemSettings: { [WATER]: 'accept' } } });
  const { result } = await tapCheckIn(lifted, client(lifted, paused));
  assert.equal(result.asked, true);
  assert.equal(result.result, 'accept');
  // Still kept: no popup.
  const kept = new FakeWx({ subscriptionsSetting: { mainSwitch: true, itemSettings: { [WATER]: 'reject' } } });
  const still = await tapCheckIn(kept, client(kept, paused));
  assert.equal(still.result.asked, false);
  // A grant held and no standing choice: no popup either.
  const held = new FakeWx({ subscriptionsSetting: { mainSwitch: true } });
  const plain = await tapCheckIn(held, client(held, { kind: 'water', template_id: WATER, needs_grant: false }));
  assert.equal(plain.result.asked, false);
  assert.deepEqual(plain.body.subscriptions_setting, read({ main_switch: true, item_settings: {} }));
});

test('no setting to read (an old base library, a failure) reports none and the tap still works', async () => {
  for (const wx of [new FakeWx(), new FakeWx({ settingFails: true, subscriptionsSetting: { mainSwitch: false } })]) {
    const c = client(wx, needing);
    const { result, body } = await tapCheckIn(wx, c);
    assert.equal(result.asked, true);
    assert.equal(body.subscriptions_setting, undefined);
    assert.equal(c.standingOf(WATER), null);
  }
});

test('requestGrants reports the setting read after its popup', async () => {
  const wx = new FakeWx({ subscriptionsSetting: { mainSwitch: true, itemSettings: { [ORDER]: 'accept' } } });
  const c = client(wx, needing);
  const result = await wx.tap(() => c.requestGrants([ORDER]));
  assert.deepEqual(result.results, { [ORDER]: 'accept' });
  const [queued] = wx.getStorageSync(c.keys.queue);
  assert.deepEqual(queued.body, {
    request_id: result.requestId,
    results: { [ORDER]: 'accept' },
    subscriptions_setting: read({ main_switch: true, item_settings: { [ORDER]: 'accept' } }),
  });
});

test('only WeChat\'s values are reported, at most 50 items', () => {
  const many = {};
  for (let i = 0; i < 60; i += 1) many[`t${i}`] = 'accept';
  assert.equal(Object.keys(toReported({ mainSwitch: true, itemSettings: many }).item_settings).length, 50);
  assert.deepEqual(toReported({ mainSwitch: true, itemSettings: { a: 'reject', b: 'other', c: 1 } }),
    { main_switch: true, item_settings: { a: 'reject' } });
  assert.equal(toReported(undefined), null);
  assert.equal(toReported({ itemSettings: {} }), null, 'no main switch: not a setting');
  assert.equal(standingOf(null, WATER), null);
});

test('the tap\'s answer is stored before the setting is read: an app killed meanwhile loses no grant', async () => {
  const wx = new FakeWx({ settingHangs: true, subscriptionsSetting: { mainSwitch: true } });
  const c = client(wx, needing);
  const pending = wx.tap(() => c.checkIn('water', { count: 1, goal: 8 }));
  await new Promise((resolve) => setTimeout(resolve, 30));
  // The popup answered; wx.getSetting has not: the queue already holds the grant.
  const [queued] = wx.getStorageSync(c.keys.queue);
  assert.equal(queued.awaitingTap, false);
  assert.equal(queued.body.subscription_status, 'accept');
  assert.match(queued.body.grant_request_id, /^wr_/);
  assert.equal(queued.body.subscriptions_setting, undefined, 'not read yet');
  wx.answerSetting();
  await pending;
  const [after] = wx.getStorageSync(c.keys.queue);
  assert.deepEqual(after.body.subscriptions_setting, read({ main_switch: true, item_settings: {} }));
});

test('a check-in that asks nothing still reports the setting read now, not the cached one', async () => {
  const wx = new FakeWx({ subscriptionsSetting: { mainSwitch: true, itemSettings: { [WATER]: 'reject' } } });
  const c = client(wx, { kind: 'water', template_id: WATER, needs_grant: false, pause_reason: 'always_rejected' });
  await c.refreshSetting();
  // The user turned the main switch off in WeChat's settings; no page show since.
  wx.subscriptionsSetting = { mainSwitch: false };
  const result = await wx.tap(() => c.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.asked, false);
  const [queued] = wx.getStorageSync(c.keys.queue);
  assert.deepEqual(queued.body.subscriptions_setting, read({ main_switch: false, item_settings: {} }));
});

test('needsGrantOf asks for a template the server holds refused once the settings no longer keep it', async () => {
  const wx = new FakeWx({ subscriptionsSetting: { mainSwitch: true, itemSettings: { [ORDER]: 'accept' } } });
  const c = client(wx, needing);
  wx.setStorageSync(c.keys.cache, { plans: {}, quotas: [
    { template_id: ORDER, available: 0, needs_grant: false, standing: 'reject' },
  ] });
  assert.equal(c.needsGrantOf(ORDER), true, 'unknown setting: ask');
  await c.refreshSetting();
  assert.equal(c.needsGrantOf(ORDER), true, 'kept accept now');
  wx.subscriptionsSetting = { mainSwitch: true, itemSettings: { [ORDER]: 'reject' } };
  await c.refreshSetting();
  assert.equal(c.needsGrantOf(ORDER), false, 'still kept reject');
});

test('a setting is stamped with when it was read, not when its action is sent', async () => {
  let now = NOW;
  const wx = new FakeWx({ subscriptionsSetting: { mainSwitch: false } });
  const c = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER }, now: () => now });
  cachePlans(wx, c, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  await c.refreshSetting();
  assert.deepEqual(c.subscriptionsSetting(), read({ main_switch: false, item_settings: {} }));
  // Read again a minute later for a check-in: the newer read is reported, and the
  // queued action keeps that stamp however late it goes out.
  now = NOW + 60000;
  wx.subscriptionsSetting = { mainSwitch: true };
  await wx.tap(() => c.checkIn('water', { count: 1, goal: 8 }));
  now = NOW + 3600000;
  const [queued] = wx.getStorageSync(c.keys.queue);
  assert.deepEqual(queued.body.subscriptions_setting, read({ main_switch: true, item_settings: {} }, NOW + 60000));
});
