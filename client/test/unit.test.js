'use strict';
// The library with a fake wx and no network at all: the tap rule, record-first, the
// decision to ask from the server's needs_grant, and what is kept for the queue.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { createClient, OnegrantError } = require('../onegrant.js');
const { FakeWx, cachePlans, scripted } = require('./fake-wx.js');

const WATER = 'tmpl_water_reminder';
const later = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function offlineClient(wx, cachedPlan) {
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER } });
  if (cachedPlan) cachePlans(wx, client, { water: cachedPlan });
  return client;
}

const needing = { kind: 'water', template_id: WATER, needs_grant: true };

test('WeChat refuses a subscribe call made after an await in the tap handler', async () => {
  const wx = new FakeWx();
  const outcome = await wx.tap(async () => {
    await Promise.resolve();
    return new Promise((resolve) => wx.requestSubscribeMessage({
      tmplIds: [WATER], success: () => resolve('accepted'), fail: (e) => resolve(e.errMsg),
    }));
  });
  assert.match(outcome, /TAP gesture/);
});

test('checkIn asks inside the tap even when the handler awaits afterwards, and gets accept', async () => {
  const wx = new FakeWx();
  const client = offlineClient(wx, needing);
  const result = await wx.tap(async () => {
    const checkedIn = client.checkIn('water', { count: 1, goal: 8 });
    await Promise.resolve();
    await later(1);
    return checkedIn;
  });
  assert.equal(result.asked, true);
  assert.equal(result.result, 'accept');
  assert.deepEqual(wx.subscribeCalls, [{ tmplIds: [WATER], inGesture: true }]);
  // Offline: kept, with the tap's answer and the ids it was given.
  assert.equal(result.queued, true);
  const [queued] = wx.getStorageSync(client.keys.queue);
  assert.equal(queued.body.action_id, result.actionId);
  assert.equal(queued.body.subscription_status, 'accept');
  assert.match(queued.body.grant_request_id, /^wr_[A-Za-z0-9_.:-]{1,61}$/);
  assert.equal(queued.awaitingTap, false);
});

test('a check-in made after an await loses the grant WeChat refused but is still recorded', async () => {
  const wx = new FakeWx();
  const client = offlineClient(wx, needing);
  const result = await wx.tap(async () => {
    await later(1);
    return client.checkIn('water', { count: 2, goal: 8 });
  });
  assert.equal(result.asked, true);
  assert.equal(result.result, null, 'WeChat refused the popup');
  const [queued] = wx.getStorageSync(client.keys.queue);
  assert.equal(queued.body.current_count, 2);
  assert.equal(queued.body.grant_request_id, undefined, 'no grant claimed without a tap');
  assert.equal(queued.body.subscription_status, undefined);
});

test('the check-in is stored before the popup answers, so a closed page loses nothing', () => {
  const wx = new FakeWx();
  const client = offlineClient(wx, needing);
  wx.tap(() => { client.checkIn('water', { count: 3, goal: 8 }); });
  const queue = wx.getStorageSync(client.keys.queue);
  assert.equal(queue.length, 1, 'recorded synchronously, inside the tap');
  assert.equal(queue[0].awaitingTap, true);
  assert.equal(queue[0].body.current_count, 3);
});

test('whether to ask comes from the cached needs_grant, never from a local count', async () => {
  const wx = new FakeWx();
  const client = offlineClient(wx, { kind: 'water', template_id: WATER, needs_grant: false });
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.asked, false);
  assert.equal(wx.subscribeCalls.length, 0, 'a grant is available: no popup');
  const [queued] = wx.getStorageSync(client.keys.queue);
  assert.equal(queued.body.grant_request_id, undefined);
  // The page leaves wx.getSetting to the library, which reads only the standing choice.
  const page = fs.readFileSync(path.join(__dirname, '../example/pages/water/index.js'), 'utf8');
  assert.doesNotMatch(page, /\.getSetting\s*\(/, 'the example page guesses quota from wx.getSetting');
});

test('a popup left unanswered by a closed page is sent without its grant after two minutes', async () => {
  const wx = new FakeWx();
  let now = Date.parse('2026-12-01T08:00:00Z');
  const sent = [];
  const client = createClient({
    baseUrl: 'http://127.0.0.1:9', wx, now: () => now,
    request: (o) => { sent.push(o.data); setTimeout(() => o.fail({ errMsg: 'request:fail' }), 0); },
    login: (o) => o.success({ code: 'c' }),
  });
  wx.setStorageSync(client.keys.cache, { plans: { water: needing } });
  wx.setStorageSync(client.keys.session, { token: 't', expiresAt: now + 3600e3 });
  // The page dies with the popup open: only the record remains.
  wx.store.set(client.keys.queue, [{
    id: 'wc_1', type: 'checkin', path: '/v1/reminders/water/checkins', awaitingTap: true, createdAt: now,
    body: { action_id: 'wc_1', occurred_at: new Date(now).toISOString(), current_count: 1, daily_goal: 8, grant_request_id: 'wr_1' },
  }]);
  await client.flush();
  assert.equal(sent.length, 0, 'still waiting for the tap');
  now += 3 * 60 * 1000;
  await client.flush();
  assert.equal(sent.length, 1);
  assert.equal(sent[0].action_id, 'wc_1');
  assert.equal(sent[0].grant_request_id, undefined, 'the unanswered grant is not claimed');
  assert.equal(wx.getStorageSync(client.keys.queue).length, 1, 'kept until the server answers');
});

test('errors say whether retrying can help', () => {
  assert.equal(new OnegrantError(0, 'network').retryable, true);
  assert.equal(new OnegrantError(503, 'unavailable', 'x', 1).retryable, true);
  assert.equal(new OnegrantError(429, 'rate_limited', 'x', 30).retryable, true);
  assert.equal(new OnegrantError(422, 'invalid_count').retryable, false);
  assert.equal(new OnegrantError(409, 'idempotency_conflict').retryable, false);
});

const session = { status: 200, data: { token: 'tok', token_type: 'Bearer', expires_in: 7200 } };

test('a popup answered after its check-in went without it reports the grant on its own, by the same id', async () => {
  const wx = new FakeWx();
  wx.holdPopups = true;
  let now = Date.parse('2026-12-01T08:00:00Z');
  const server = scripted(() => null);
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, now: () => now, request: server.request,
    login: (o) => o.success({ code: 'c' }) });
  wx.setStorageSync(client.keys.cache, { plans: { water: needing } });
  const pending = wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  const grantId = wx.getStorageSync(client.keys.queue)[0].body.grant_request_id;
  now += 3 * 60 * 1000; // the page comes back after three minutes
  await client.flush();
  wx.held('accept');
  const result = await pending;
  assert.equal(result.result, 'accept');
  const queue = wx.getStorageSync(client.keys.queue);
  assert.deepEqual(queue.map((i) => i.type), ['checkin', 'grants']);
  assert.equal(queue[0].body.grant_request_id, undefined, 'the check-in went on without the grant');
  assert.deepEqual(queue[1].body, { request_id: grantId, results: { [WATER]: 'accept' } });
});

test('a session that cannot be had keeps the queue; it is not the action the server refused', async () => {
  const wx = new FakeWx();
  const server = scripted((method, path) => (path === '/v1/session'
    ? { status: 422, data: { error: { code: 'invalid_code_format', message: 'bad code' } } } : null));
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, request: server.request,
    login: (o) => o.success({ code: '' }) });
  wx.setStorageSync(client.keys.cache, { plans: { water: needing } });
  await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  await wx.tap(() => client.checkIn('water', { count: 2, goal: 8 }));
  assert.equal(client.pendingCount(), 2, 'both kept');
  assert.ok(server.log.every((r) => r.path === '/v1/session'), 'no check-in sent without a session');
});

test('a 503 with Retry-After holds the queue back until then, and the same ids go again', async () => {
  const wx = new FakeWx();
  let now = Date.parse('2026-12-01T08:00:00Z');
  let busy = true;
  const server = scripted((method, path, body) => {
    if (path === '/v1/session') return session;
    if (busy) return { status: 503, data: { error: { code: 'unavailable' } }, header: { 'Retry-After': '30' } };
    return { status: 200, data: { kind: 'water', needs_grant: false, template_id: WATER, echo: body.action_id } };
  });
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, now: () => now, request: server.request,
    login: (o) => o.success({ code: 'c' }) });
  cachePlans(wx, client, { water: { ...needing, needs_grant: false } });
  const first = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(first.queued, true);
  const sends = () => server.log.filter((r) => r.path.endsWith('/checkins')).length;
  assert.equal(sends(), 1);
  busy = false;
  await client.flush();
  assert.equal(sends(), 1, 'nothing sent before Retry-After');
  now += 31 * 1000;
  const flushed = await client.flush();
  assert.equal(sends(), 2);
  assert.equal(flushed.answers[first.actionId].data.echo, first.actionId, 'the same action id');
  assert.equal(client.pendingCount(), 0);
});

test('a refused check-in still reports the grant the user accepted; an action older than the server remembers is dropped', async () => {
  const wx = new FakeWx();
  let now = Date.parse('2026-12-01T08:00:00Z');
  const errors = [];
  const server = scripted((method, path) => {
    if (path === '/v1/session') return session;
    if (path.endsWith('/checkins')) return { status: 404, data: { error: { code: 'not_found', message: 'no such kind' } } };
    return { status: 200, data: { grants: [], quotas: [] } };
  });
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, now: () => now, request: server.request,
    login: (o) => o.success({ code: 'c' }), templates: { tea: WATER }, onError: (e) => errors.push(e.code) });
  const refused = await wx.tap(() => client.checkIn('tea', { count: 1, goal: 8 }));
  assert.equal(refused.error.code, 'not_found');
  const checkin = server.log.find((r) => r.path.endsWith('/checkins'));
  const report = server.log.find((r) => r.path === '/v1/grants');
  assert.match(checkin.body.grant_request_id, /^wr_/);
  assert.deepEqual(report.body, { request_id: checkin.body.grant_request_id, results: { [WATER]: 'accept' } });
  assert.equal(client.pendingCount(), 0);

  wx.setStorageSync(client.keys.queue, [{
    id: 'wc_old', type: 'checkin', path: '/v1/reminders/water/checkins', awaitingTap: false,
    createdAt: now - 35 * 24 * 3600 * 1000, body: { action_id: 'wc_old' },
  }]);
  const before = server.log.length;
  const flushed = await client.flush();
  assert.equal(flushed.answers.wc_old.error.code, 'expired');
  assert.equal(server.log.length, before, 'never sent');
  assert.deepEqual(errors, ['not_found', 'expired']);
});

const REFILL = 'tmpl_grants_used_up';
const paired = Object.assign({}, needing, { refill_template_id: REFILL });

test('a check-in asks for the refill notice in the same tap and reports its answer on its own', async () => {
  for (const [decision, expected] of [['accept', 'accept'], ['reject', 'reject']]) {
    const wx = new FakeWx({ decisions: { [REFILL]: decision } });
    const client = offlineClient(wx, paired);
    const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
    assert.deepEqual(wx.subscribeCalls, [{ tmplIds: [WATER, REFILL], inGesture: true }], 'one popup, both templates');
    assert.equal(result.result, 'accept');
    assert.equal(result.refill, expected);
    const queue = wx.getStorageSync(client.keys.queue);
    assert.deepEqual(queue.map((i) => i.type), ['checkin', 'grants']);
    assert.equal(queue[0].body.subscription_status, 'accept');
    assert.notEqual(queue[1].body.request_id, queue[0].body.grant_request_id, 'its own request id');
    assert.deepEqual(queue[1].body.results, { [REFILL]: expected });
    assert.equal(queue[1].awaitingTap, false);
  }
});

test('no refill is asked without a pairing, without a need, or left queued when the popup fails', async () => {
  // No pairing: one template.
  const plain = new FakeWx();
  await plain.tap(() => offlineClient(plain, needing).checkIn('water', { count: 1, goal: 8 }));
  assert.deepEqual(plain.subscribeCalls.map((c) => c.tmplIds), [[WATER]]);
  // No grant needed: no popup at all.
  const full = new FakeWx();
  const enough = Object.assign({}, paired, { needs_grant: false });
  const quiet = await full.tap(() => offlineClient(full, enough).checkIn('water', { count: 1, goal: 8 }));
  assert.equal(full.subscribeCalls.length, 0);
  assert.equal(quiet.refill, null);
  // The popup fails (called outside the tap): the refill report is taken off the queue.
  const late = new FakeWx();
  const client = offlineClient(late, paired);
  const failed = await late.tap(async () => {
    await later(1);
    return client.checkIn('water', { count: 1, goal: 8 });
  });
  assert.equal(failed.refill, null);
  assert.deepEqual(late.getStorageSync(client.keys.queue).map((i) => i.type), ['checkin']);
});

test('the refill template is asked only while no grant of it is held, as the cached quotas say', async () => {
  const wx = new FakeWx();
  const client = offlineClient(wx, paired);
  wx.setStorageSync(client.keys.cache, {
    quotas: [{ template_id: REFILL, available: 0, needs_grant: true }], plans: { water: paired },
  });
  await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  // Accepted once: held now, so the next needing tap asks for the main template only.
  await wx.tap(() => client.checkIn('water', { count: 2, goal: 8 }));
  assert.deepEqual(wx.subscribeCalls.map((c) => c.tmplIds), [[WATER, REFILL], [WATER]]);
  const held = new FakeWx();
  const other = createClient({ baseUrl: 'http://127.0.0.1:9', wx: held, templates: { water: WATER } });
  held.setStorageSync(other.keys.cache, {
    quotas: [{ template_id: REFILL, available: 1, needs_grant: false }], plans: { water: paired },
  });
  await held.tap(() => other.checkIn('water', { count: 1, goal: 8 }));
  assert.deepEqual(held.subscribeCalls.map((c) => c.tmplIds), [[WATER]]);
});
