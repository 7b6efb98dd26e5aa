'use strict';
// The library against the real local stack (onegrant-local: the HTTP API, the DynamoDB
// emulator and the WeChat stand-in), over real HTTP. No mocked backend: what the
// server shows afterwards is read back through its API.

const test = require('node:test');
const assert = require('node:assert/strict');
const { createClient } = require('../onegrant.js');
const { FakeWx } = require('./fake-wx.js');
const { startStack, httpRequest, standinLogin, notify } = require('./stack.js');

const WATER = 'tmpl_water_reminder';
const ORDER = 'tmpl_order_status';
const USED_UP = 'tmpl_grants_used_up';

let stack;
test.before(async () => { stack = await startStack(); });
test.after(async () => { if (stack) await stack.stop(); });

/** A user's phone: one storage, a network the test can cut, pages made on demand. */
function phone(user) {
  const net = { offline: false, log: [] };
  const counter = { logins: 0 };
  const store = new Map();
  const page = (extra) => {
    const wx = new FakeWx({ store, request: httpRequest(net), login: standinLogin(stack, user, counter) });
    const errors = [];
    const client = createClient(Object.assign({
      baseUrl: stack.api, wx, onError: (e) => errors.push(e),
    }, extra));
    return { wx, client, errors };
  };
  return { net, counter, store, page };
}

function posts(net, path) {
  return net.log.filter((r) => r.method === 'POST' && r.path === path);
}

async function quota(client, template) {
  return (await client.quotas()).find((q) => q.template_id === template);
}

test('a check-in whose plan needs a grant asks in the tap and the grant reaches the server once', async () => {
  const { page } = phone('ann');
  const { wx, client } = page();
  await client.updatePlan('water', { enabled: true });
  const { plans } = await client.prefetch();
  assert.equal(plans.water.needs_grant, true, 'a new user has no grant');
  const result = await wx.tap(async () => {
    const done = client.checkIn('water', { count: 1, goal: 8 });
    await Promise.resolve();
    return done;
  });
  assert.equal(result.result, 'accept');
  assert.equal(result.plan.needs_grant, false, 'the server answered with the grant counted');
  assert.equal(result.plan.state, 'scheduled');
  const water = await quota(client, WATER);
  assert.deepEqual([water.accepted, water.available], [1, 1]);
  // The same tap asked for the refill notice's template (the server's pairing), and
  // its grant reached the server on its own.
  assert.equal(plans.water.refill_template_id, USED_UP);
  assert.deepEqual(wx.subscribeCalls.map((c) => c.tmplIds), [[WATER, USED_UP]]);
  assert.equal(result.refill, 'accept');
  const usedUp = await quota(client, USED_UP);
  assert.deepEqual([usedUp.accepted, usedUp.available], [1, 1]);
  // The next tap does not ask: the answer said no grant is needed.
  const next = await wx.tap(() => client.checkIn('water', { count: 2, goal: 8 }));
  assert.equal(next.asked, false);
  assert.equal(wx.subscribeCalls.length, 1);
});

test('the standing choice: a kept reject pauses the plan without a popup; kept accept again, the next tap resumes it', async () => {
  const { page } = phone('cai');
  const { wx, client } = page();
  wx.subscriptionsSetting = { mainSwitch: true, itemSettings: { [WATER]: 'accept' } };
  await client.updatePlan('water', { enabled: true });
  await client.prefetch();
  const first = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(first.result, 'accept', 'a kept accept is a silent accept: one grant');
  assert.equal(first.plan.state, 'scheduled');
  assert.equal((await quota(client, WATER)).standing, 'accept');
  // In WeChat's settings the user now keeps reject; the page shows again.
  wx.subscriptionsSetting = { mainSwitch: true, itemSettings: { [WATER]: 'reject' } };
  await client.prefetch();
  const second = await wx.tap(() => client.checkIn('water', { count: 2, goal: 8 }));
  assert.equal(second.asked, false, 'no popup: WeChat would answer reject');
  assert.deepEqual([second.plan.state, second.plan.pause_reason, second.plan.needs_grant],
    ['paused', 'always_rejected', false]);
  const water = await quota(client, WATER);
  assert.deepEqual([water.standing, water.needs_grant, water.available], ['reject', false, 1]);
  // Kept accept again: the next tap asks, its silent accept resumes the plan.
  wx.subscriptionsSetting = { mainSwitch: true, itemSettings: { [WATER]: 'accept' } };
  await client.prefetch();
  const third = await wx.tap(() => client.checkIn('water', { count: 3, goal: 8 }));
  assert.equal(third.asked, true);
  assert.deepEqual([third.plan.state, third.plan.needs_grant], ['scheduled', false]);
  assert.equal(wx.subscribeCalls.length, 2);
  assert.equal((await quota(client, WATER)).accepted, 2, 'each tap counted once');
});

test('offline: stored and queued; back online: one check-in and one grant, whatever retries and pages race', async () => {
  const { net, page } = phone('bea');
  const a = page();
  await a.client.prefetch();
  net.offline = true;
  const result = await a.wx.tap(() => a.client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.result, 'accept');
  assert.equal(result.queued, true);
  assert.equal(result.plan, null);
  const [queued] = a.wx.getStorageSync(a.client.keys.queue);
  assert.equal(queued.body.action_id, result.actionId);

  net.offline = false;
  const b = page(); // a second page of the same mini-program: same storage
  const flushes = await Promise.all([
    a.client.flush(), b.client.flush(), a.client.flush(), b.client.flush(), a.client.flush(),
  ]);
  assert.ok(flushes.every((f) => f.pending === 0), 'the queue drained');
  const sent = posts(net, '/v1/reminders/water/checkins');
  assert.ok(sent.length >= 2, `the pages raced: ${sent.length} submits`);
  for (const request of sent) {
    assert.equal(request.status, 200);
    assert.equal(request.body.action_id, queued.body.action_id, 'the same action id every time');
    assert.equal(request.body.grant_request_id, queued.body.grant_request_id, 'the same grant id every time');
  }
  // Every submit got the first answer again: one check-in, replayed.
  const answers = flushes.flatMap((f) => Object.entries(f.answers))
    .filter(([id]) => id === result.actionId).map(([, a]) => JSON.stringify(a.data));
  assert.ok(answers.length >= 2);
  assert.equal(new Set(answers).size, 1, 'identical answers: the server recorded one check-in');
  const water = await quota(a.client, WATER);
  assert.deepEqual([water.accepted, water.available], [1, 1], 'one grant on the server');
});

test('a grant report whose answer is lost after the server committed is retried with the same request_id', async () => {
  const { net, page } = phone('cai');
  const { wx, client } = page();
  await client.prefetch();
  let dropped = 0;
  net.dropAnswer = (request) => request.path === '/v1/grants' && request.method === 'POST' && dropped++ === 0;
  const result = await wx.tap(() => client.requestGrants([ORDER]));
  assert.equal(result.queued, true, 'the answer was lost');
  assert.deepEqual(result.results, { [ORDER]: 'accept' });
  const flushed = await client.flush();
  assert.equal(flushed.pending, 0);
  const reports = posts(net, '/v1/grants');
  assert.equal(reports.length, 2, 'sent, then sent again');
  assert.equal(reports[0].body.request_id, reports[1].body.request_id);
  assert.ok(reports.every((r) => r.status === 200));
  const order = await quota(client, ORDER);
  assert.deepEqual([order.accepted, order.available], [1, 1], 'exactly one grant');
});

test('a session that expires mid-queue means one new login and the queue drains', async () => {
  const { net, counter, page } = phone('dan');
  const { wx, client } = page();
  await client.prefetch();
  const logins = counter.logins;
  net.offline = true;
  for (let i = 1; i <= 3; i += 1) {
    await wx.tap(() => client.checkIn('water', { count: i, goal: 8 }));
  }
  // Three check-ins, and the refill template's grant from the first tap only (held
  // once accepted).
  assert.equal(client.pendingCount(), 4);
  assert.deepEqual(wx.subscribeCalls.map((c) => c.tmplIds), [[WATER, USED_UP], [WATER], [WATER]]);
  net.offline = false;
  // After the first check-in lands, the stored session stops being accepted.
  let expired = false;
  net.afterAnswer = (request) => {
    if (!expired && request.path === '/v1/reminders/water/checkins' && request.status === 200) {
      expired = true;
      wx.setStorageSync(client.keys.session, { token: 'expired.session.token', expiresAt: Date.now() + 3600e3 });
    }
  };
  const flushed = await client.flush();
  assert.equal(flushed.pending, 0, 'the queue drained');
  assert.equal(counter.logins, logins + 1, 'exactly one new login');
  // In the queue's order: the first check-in, the refill grant's report (refused once,
  // then sent again under the new session), the other two check-ins.
  const queued = net.log.filter((r) => r.method === 'POST'
    && ['/v1/reminders/water/checkins', '/v1/grants'].includes(r.path));
  assert.deepEqual(queued.map((r) => [r.path, r.status]), [
    ['/v1/reminders/water/checkins', 200], ['/v1/grants', 401], ['/v1/grants', 200],
    ['/v1/reminders/water/checkins', 200], ['/v1/reminders/water/checkins', 200],
  ]);
  const checkins = posts(net, '/v1/reminders/water/checkins');
  assert.equal(new Set(checkins.map((r) => r.body.action_id)).size, 3);
  const water = await quota(client, WATER);
  assert.equal(water.accepted, 3, 'each tap reported its grant once');
  assert.equal((await quota(client, USED_UP)).accepted, 1, 'the refill grant once');
});

test('a definite refusal is surfaced and never retried; a retryable one keeps the action queued', async () => {
  const { net, page } = phone('eve');
  const { wx, client, errors } = page({ templates: { tea: WATER } });
  await client.prefetch();
  const refused = await wx.tap(() => client.checkIn('tea', { count: 1, goal: 8 }));
  assert.equal(refused.error.code, 'not_found');
  assert.equal(refused.error.status, 404);
  assert.equal(client.pendingCount(), 0, 'a 404 is not retried');
  assert.equal(errors.filter((e) => e.code === 'not_found').length, 1);
  const bad = await wx.tap(() => client.checkIn('water', { count: -1, goal: 8 }));
  assert.equal(bad.error.code, 'invalid_count');
  assert.equal(client.pendingCount(), 0);
  net.offline = true;
  await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  await client.flush();
  assert.equal(client.pendingCount(), 1, 'no answer: kept for later');
  net.offline = false;
  assert.equal((await client.flush()).pending, 0);
});

test('the inbox: pages, the unread count, one read and all read', async () => {
  const { counter, page } = phone('fay');
  const { client } = page();
  await client.prefetch();
  for (let i = 0; i < 3; i += 1) {
    const answer = await notify(stack, {
      idempotency_key: `fay-${i}`, openid: counter.openid, type: 'order', title: `订单 ${i} 已发货`,
    });
    assert.equal(answer.status, 'created');
  }
  assert.equal(await client.unreadCount(), 3);
  const first = await client.notifications({ limit: 2 });
  assert.equal(first.items.length, 2);
  assert.equal(first.items[0].title, '订单 2 已发货', 'newest first');
  const rest = await client.notifications({ limit: 2, cursor: first.next_cursor });
  assert.equal(rest.items.length, 1);
  const read = await client.markRead(first.items[0].id);
  assert.equal(read.read, true);
  assert.equal(await client.unreadCount(), 2);
  const unread = await client.notifications({ read: false });
  assert.equal(unread.items.length, 2);
  assert.equal(await client.markAllRead(), 2);
  assert.equal(await client.unreadCount(), 0);
});

test('push preferences: saved and read back, refused with a code', async () => {
  const { page } = phone('gus');
  const { client } = page();
  await client.prefetch();
  assert.deepEqual(await client.getPreferences(), { quiet_hours: null, muted_types: [] });
  const wanted = {
    quiet_hours: { start: '22:00', end: '08:00', timezone: 'Asia/Shanghai' },
    muted_types: ['marketing'],
  };
  assert.deepEqual(await client.setPreferences(wanted), wanted);
  assert.deepEqual(await client.getPreferences(), wanted);
  await assert.rejects(
    client.setPreferences({ quiet_hours: { start: '22:00', end: '24:00', timezone: 'UTC' }, muted_types: [] }),
    (e) => e.status === 422 && e.code === 'invalid_quiet_hours',
  );
});
