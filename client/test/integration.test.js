'use strict';
// The library against the real local stack (onegrant-local: the HTTP API, the DynamoDB
// emulator and the WeChat stand-in), over real HTTP. No mocked backend: what the
// server shows afterwards is read back through its API.

const test = require('node:test');
const assert = require('node:assert/strict');
const { createClient } = require('../onegrant.js');
const { FakeWx } = require('./fake-wx.js');
const { startStack, httpRequest, standinLogin, notify, tick } = require('./stack.js');

const WATER = 'tmpl_water_reminder';
/** onegrant-local's session key (local/src/stack.rs), which a host's backend would share. */
const LOCAL_SESSION_SECRET = 'local-development-session-secret-not-for-production';
const ORDER = 'tmpl_order_status';
const USED_UP = 'tmpl_grants_used_up';

let stack;
test.before(async () => { stack = await startStack(); });
test.after(async () => { if (stack) await stack.stop(); });

/** A user's phone: one mini-program (one `wx`, one storage), a network the test can
 *  cut, pages made on demand. */
function phone(user) {
  const net = { offline: false, log: [] };
  const counter = { logins: 0 };
  const store = new Map();
  const wx = new FakeWx({ store, request: httpRequest(net), login: standinLogin(stack, user, counter) });
  // WeChat counts each accept on its side too: the stand-in is told, so a send spends it.
  const ask = wx.requestSubscribeMessage.bind(wx);
  wx.requestSubscribeMessage = (options) => ask(Object.assign({}, options, {
    success: (res) => {
      const accepted = counter.openid ? options.tmplIds.filter((id) => res[id] === 'accept') : [];
      Promise.all(accepted.map((id) => fetch(`${stack.standin}/control/quota`, {
        method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ openid: counter.openid, template_id: id, count: 1 }),
      }))).then(() => options.success(res), () => options.success(res));
    },
  }));
  const page = (extra) => {
    const errors = [];
    const client = createClient(Object.assign({
      baseUrl: stack.api, wx, onError: (e) => errors.push(e),
    }, extra));
    return { wx, client, errors };
  };
  return { net, counter, store, page, wx };
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

test('offline: stored and queued; back online: each action submitted once, in order, however many pages flush', async () => {
  const { net, page } = phone('bea');
  const a = page();
  await a.client.prefetch();
  net.offline = true;
  const result = await a.wx.tap(() => a.client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.result, 'accept');
  assert.equal(result.queued, true);
  assert.equal(result.plan, null);
  const b = page(); // a second page of the same mini-program
  const order = await b.wx.tap(() => b.client.requestGrants([ORDER]));
  assert.equal(order.queued, true);
  const third = await a.wx.tap(() => a.client.checkIn('water', { count: 2, goal: 8 }));
  const queued = a.client.queue();
  // The first tap's refill notice is reported on its own, right after its check-in.
  assert.deepEqual(queued.map((i) => i.id), [result.actionId, queued[1].id, order.requestId, third.actionId]);
  assert.deepEqual(queued[1].body.results, { [USED_UP]: 'accept' });

  net.offline = false;
  const flushes = await Promise.all([
    a.client.flush(), b.client.flush(), a.client.flush(), b.client.flush(), a.client.flush(),
  ]);
  assert.ok(flushes.every((f) => f.pending === 0), 'the queue drained');
  const submitted = net.log.filter((r) => r.method === 'POST' && r.path !== '/v1/session')
    .map((r) => r.body.action_id || r.body.request_id);
  assert.deepEqual(submitted, queued.map((i) => i.id), 'once each, in the order they were made');
  const sent = posts(net, '/v1/reminders/water/checkins')[0];
  assert.equal(sent.body.grant_request_id, queued[0].body.grant_request_id, 'the grant id made at the tap');
  // Every page heard the answer.
  for (const f of flushes) assert.equal(f.answers[third.actionId].data.today.count, 2);
  const water = await quota(a.client, WATER);
  assert.deepEqual([water.accepted, water.available], [2, 2], 'one grant per accepted tap, however many submits');
  assert.equal((await quota(a.client, ORDER)).accepted, 1);
});

test('a refusal made after an accept, both queued offline, is never undone: submitted in the order made', async () => {
  const { net, page, wx } = phone('joy');
  const a = page();
  await a.client.updatePlan('water', { enabled: true });
  await a.client.prefetch();
  net.offline = true;
  const accepted = await wx.tap(() => a.client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(accepted.result, 'accept');
  // Later, on another page, the user rejects the same template.
  wx.decisions[WATER] = 'reject';
  const b = page();
  const refused = await wx.tap(() => b.client.requestGrants([WATER]));
  assert.deepEqual(refused.results, { [WATER]: 'reject' });
  net.offline = false;
  await Promise.all([b.client.flush(), a.client.flush(), b.client.flush()]);
  const order = net.log.filter((r) => r.method === 'POST' && r.path !== '/v1/session')
    .map((r) => r.body.action_id || r.body.request_id);
  assert.equal(order.indexOf(accepted.actionId), 0, `the accept first: ${order}`);
  assert.equal(order[order.length - 1], refused.requestId, 'the refusal last');
  const plan = await a.client.getPlan('water');
  assert.deepEqual([plan.state, plan.pause_reason, plan.needs_grant], ['paused', 'rejected', true],
    'the refusal holds until a new accept');
});

test('a reminder spends the last grant: the next tap, before any refresh, asks and the chain goes on', async () => {
  const { net, page } = phone('hal');
  // The first page's clock runs 15 minutes less 4 s behind: its check-in counts then,
  // so the reminder it schedules is due 4 s from now.
  const behind = (15 * 60 - 4) * 1000;
  const first = page({ now: () => Date.now() - behind });
  // A zone where it is midday now, so the reminder falls inside waking hours whenever
  // the test runs.
  const shift = 12 - new Date().getUTCHours();
  const timezone = shift === 0 ? 'UTC' : `Etc/GMT${shift > 0 ? '-' : '+'}${Math.abs(shift)}`;
  await first.client.updatePlan('water', {
    enabled: true, interval_minutes: 15, wake_time: '06:00', sleep_time: '22:00', timezone, daily_goal: 50,
  });
  await first.client.prefetch();
  const checkedIn = await first.wx.tap(() => first.client.checkIn('water', { count: 1, goal: 50 }));
  assert.equal(checkedIn.result, 'accept');
  assert.deepEqual([checkedIn.plan.state, checkedIn.plan.needs_grant], ['scheduled', false]);
  const due = Date.parse(checkedIn.plan.next_due_at);
  assert.ok(due > Date.now() && due < Date.now() + 60e3, checkedIn.plan.next_due_at);
  // The reminder goes out and spends the only grant; the cache still says none is needed.
  while (Date.now() <= due) await new Promise((resolve) => setTimeout(resolve, 200));
  const ran = await tick(stack);
  assert.equal(ran.sent, 1, JSON.stringify(ran));
  const cached = first.client.cachedPlan('water');
  assert.equal(cached.needs_grant, false, 'the cache is stale');
  // The user opens the page from that reminder and taps before anything is fetched.
  const reads = net.log.filter((r) => r.method === 'GET').length;
  const second = page();
  const tapped = await second.wx.tap(() => second.client.checkIn('water', { count: 2, goal: 50 }));
  assert.equal(net.log.filter((r) => r.method === 'GET').length, reads, 'no refresh before the tap');
  assert.equal(tapped.asked, true, 'its reminder time has passed: asked');
  assert.equal(tapped.result, 'accept');
  assert.deepEqual([tapped.plan.state, tapped.plan.needs_grant], ['scheduled', false], 'the chain goes on');
  const water = await quota(second.client, WATER);
  assert.deepEqual([water.accepted, water.used, water.available], [2, 1, 1]);
});

/** What a host's backend does with the session key it shares with onegrant: an HS256
 *  JWT naming the openid its own code2session found (iss onegrant, exp). */
function hostToken(openid, secret, seconds) {
  const crypto = require('node:crypto');
  const part = (value) => Buffer.from(JSON.stringify(value)).toString('base64url');
  const now = Math.floor(Date.now() / 1000);
  const unsigned = `${part({ alg: 'HS256', typ: 'JWT' })}.${part({ sub: openid, iat: now, exp: now + seconds, iss: 'onegrant' })}`;
  return `${unsigned}.${crypto.createHmac('sha256', secret).update(unsigned).digest('base64url')}`;
}

test('a host-supplied session: onegrant never calls wx.login and the host\'s token is accepted', async () => {
  const net = { offline: false, log: [] };
  // The host app's own login, once: its backend learns the openid (here from the stand-in).
  const login = await (await fetch(`${stack.standin}/control/login-codes`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ user: 'ivy' }),
  })).json();
  let minted = 0;
  const wx = new FakeWx({ request: httpRequest(net), login: () => { throw new Error('wx.login called'); } });
  const client = createClient({
    baseUrl: stack.api, wx, templates: { water: WATER },
    session: () => {
      minted += 1;
      return Promise.resolve({ token: hostToken(login.openid, LOCAL_SESSION_SECRET, 600), expires_in: 600 });
    },
  });
  const plan = await client.updatePlan('water', { enabled: true });
  assert.equal(plan.state, 'paused', JSON.stringify(plan));
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.result, 'accept');
  assert.deepEqual([result.plan.state, result.plan.needs_grant], ['scheduled', false]);
  assert.equal(minted, 1, 'one token for every call while it lasts');
  assert.equal(posts(net, '/v1/session').length, 0, 'no onegrant login');
  // A token signed with another key is refused; the host is asked once more, then it fails.
  const forged = createClient({
    baseUrl: stack.api, wx: new FakeWx({ request: httpRequest(net) }),
    session: () => Promise.resolve({ token: hostToken(login.openid, 'not-the-key-'.repeat(4), 600), expires_in: 600 }),
  });
  await assert.rejects(forged.getPlan('water'), (e) => e.status === 401);
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

test('erase: the user is forgotten, the device drops its copy, the next call starts an empty account', async () => {
  const { page } = phone('hal');
  const { client } = page();
  await client.prefetch();
  await client.setPreferences({ quiet_hours: null, muted_types: ['marketing'] });
  const copy = await client.exportData();
  const prefs = copy.find((item) => item.kind === 'preferences');
  assert.deepEqual(prefs && prefs.muted_types, ['marketing'], JSON.stringify(copy));
  assert.ok(copy.every((item) => !('pk' in item)), 'no table plumbing');
  assert.equal(await client.erase(), 'pending');
  assert.deepEqual(client.cache().plans, {}, 'the cache dropped');
  // While the erasure runs nothing is stored for the user: a new session too is
  // refused until it is done (the server's dispatcher finishes it).
  await assert.rejects(client.getPreferences(), (e) => e.status === 401);
});
