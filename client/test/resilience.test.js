'use strict';
// The second pass, with a fake wx that fails as WeChat's does: a stale cache, popups
// failing with each errCode, a full or unreadable storage, configuration errors, two
// pages on one queue, retries without a tap, a clock set back, a host's session.

const test = require('node:test');
const assert = require('node:assert/strict');
const { createClient, OnegrantError, SUBSCRIBE_FAILURES } = require('../onegrant.js');
const { FakeWx, cachePlans, scripted } = require('./fake-wx.js');

const WATER = 'tmpl_water_reminder';
const later = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const session = { status: 200, data: { token: 'tok', token_type: 'Bearer', expires_in: 7200 } };
const T0 = Date.parse('2026-12-01T08:00:00Z');

/** A server that answers every check-in 200 with its plan (and grants 200). */
function accepting(extra) {
  return scripted((method, path, body) => {
    if (extra) {
      const answer = extra(method, path, body);
      if (answer !== undefined) return answer;
    }
    if (path === '/v1/session') return session;
    if (path === '/v1/grants') return { status: 200, data: { grants: [], quotas: [] } };
    return { status: 200, data: { kind: 'water', template_id: WATER, needs_grant: false, echo: body && body.action_id } };
  });
}

function online(wx, server, extra) {
  return createClient(Object.assign({
    baseUrl: 'http://127.0.0.1:9', wx, request: server.request, login: (o) => o.success({ code: 'c' }),
    templates: { water: WATER },
  }, extra));
}

const checkins = (server) => server.log.filter((r) => r.path.endsWith('/checkins')).map((r) => r.body.action_id);

test('a plan cached before this foreground session, or past its next_due_at, asks; a fresh one does not', async () => {
  const wx = new FakeWx();
  let now = T0;
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, now: () => now, templates: { water: WATER } });
  const plan = {
    kind: 'water', template_id: WATER, state: 'scheduled', needs_grant: false,
    next_due_at: new Date(T0 + 3600e3).toISOString(),
  };
  cachePlans(wx, client, { water: plan });
  assert.equal(client.needsGrant('water'), false, 'fresh, a grant held, not yet due');
  // The user leaves; the reminder spends the last grant; the user opens the app from it.
  now += 2 * 3600e3;
  wx.appShow();
  assert.equal(client.needsGrant('water'), true, 'cached before this foreground session');
  const tapped = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(tapped.asked, true);
  assert.equal(tapped.result, 'accept');
  // Fetched again in this session, but its reminder time has passed since.
  cachePlans(wx, client, { water: plan });
  assert.equal(client.needsGrant('water'), true, 'next_due_at has passed');
  cachePlans(wx, client, { water: { ...plan, next_due_at: new Date(now + 600e3).toISOString() } });
  assert.equal(client.needsGrant('water'), false);
  now += 601e3;
  assert.equal(client.needsGrant('water'), true, 'due while the page was open');
  // A disabled plan sends nothing: staleness never asks for it.
  cachePlans(wx, client, { water: { ...plan, state: 'disabled', next_due_at: null } });
  now += 1;
  wx.appShow();
  assert.equal(client.needsGrant('water'), false);
});

test('a failed popup carries its errCode and a stable reason, in the result and through onError', async () => {
  const cases = [
    [{ errCode: 20004, errMsg: 'requestSubscribeMessage:fail main switch is off' }, 'switched_off'],
    [{ errCode: 20001, errMsg: 'requestSubscribeMessage:fail No template data return' }, 'template_invalid'],
    [{ errCode: 10005, errMsg: 'requestSubscribeMessage:fail can not show UI' }, 'ui_unavailable'],
    [{ errCode: 20002, errMsg: 'requestSubscribeMessage:fail mixed' }, 'templates_mixed'],
    [{ errCode: 99999, errMsg: 'requestSubscribeMessage:fail something new' }, 'unknown'],
    [{ errCode: null, errMsg: 'requestSubscribeMessage:fail' }, 'unknown'],
  ];
  // And every code of WeChat's table, as the library names it.
  for (const [code, reason] of Object.entries(SUBSCRIBE_FAILURES)) {
    cases.push([{ errCode: Number(code), errMsg: `requestSubscribeMessage:fail ${code}` }, reason]);
  }
  for (const [failure, reason] of cases) {
    const wx = new FakeWx({ subscribeFails: failure });
    const errors = [];
    const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER },
      onError: (e) => errors.push(e) });
    const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
    const expected = { code: 'subscribe_failed', errCode: failure.errCode, reason, message: failure.errMsg };
    assert.equal(typeof reason, 'string');
    assert.deepEqual(result.subscribeError, expected, `errCode ${failure.errCode}`);
    assert.deepEqual(errors.find((e) => e.code === 'subscribe_failed'), expected);
    const [queued] = wx.getStorageSync(client.keys.queue);
    assert.equal(queued.body.grant_request_id, undefined, 'no grant claimed for a failed popup');
  }
  // A popup asked for outside the tap fails without an errCode.
  const wx = new FakeWx();
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER } });
  const late = await wx.tap(async () => {
    await later(1);
    return client.requestGrants([WATER]);
  });
  assert.equal(late.subscribeError.reason, 'not_in_tap');
  assert.equal(late.subscribeError.errCode, null);
});

test('a full storage never loses the tap: the popup shows, the action goes at once, the caller is told', async () => {
  const wx = new FakeWx({ storageLimit: 2000 });
  wx.store.set('host-app-data', 'x'.repeat(1990)); // the host app filled the storage
  const server = accepting();
  const errors = [];
  const client = online(wx, server, { onError: (e) => errors.push(e.code) });
  let pending;
  assert.doesNotThrow(() => { pending = wx.tap(() => client.checkIn('water', { count: 1, goal: 8 })); });
  const result = await pending;
  assert.equal(wx.subscribeCalls.length, 1, 'the popup still showed');
  assert.equal(result.stored, false);
  assert.equal(result.queued, false);
  assert.equal(result.plan.echo, result.actionId, 'submitted at once, from memory');
  const [sent] = server.log.filter((r) => r.path.endsWith('/checkins'));
  assert.equal(sent.body.subscription_status, 'accept', 'with the grant the user gave');
  assert.match(sent.body.grant_request_id, /^wr_/);
  assert.ok(errors.includes('not_stored'), `told: ${errors}`);
  assert.equal(client.pendingCount(), 0);
});

test('storage filling while the popup is open keeps the accepted grant', async () => {
  const wx = new FakeWx();
  wx.holdPopups = true;
  const server = accepting((method, path) => (path.endsWith('/checkins') ? null : undefined));
  const client = online(wx, server);
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: true } });
  const pending = wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  wx.storageLimit = 0; // nothing more can be written
  wx.held('accept');
  const result = await pending;
  assert.equal(result.result, 'accept');
  assert.equal(result.queued, true, 'offline: kept');
  assert.equal(result.stored, false, 'the caller is told the answer is in memory only');
  const [queued] = client.queue();
  assert.equal(queued.body.subscription_status, 'accept', 'the answer is kept in memory');
  // The storage frees up: the next write stores the whole queue.
  wx.storageLimit = 10 * 1024 * 1024;
  client.dequeue('nothing');
  assert.equal(wx.getStorageSync(client.keys.queue)[0].body.subscription_status, 'accept');
});

test('a storage that cannot be read keeps new actions in memory and never overwrites the stored ones', async () => {
  const wx = new FakeWx();
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER } });
  const old = { id: 'wc_old', type: 'checkin', path: '/v1/reminders/water/checkins', awaitingTap: false,
    createdAt: Date.now() - 1000, body: { action_id: 'wc_old' } };
  wx.setStorageSync(client.keys.queue, [old]);
  wx.readFails = true;
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.stored, false);
  wx.readFails = false;
  assert.deepEqual(wx.store.get(client.keys.queue).map((i) => i.id), ['wc_old'], 'not overwritten meanwhile');
  assert.deepEqual(client.queue().map((i) => i.id), ['wc_old', result.actionId], 'merged, oldest first');
  assert.deepEqual(wx.store.get(client.keys.queue).map((i) => i.id), ['wc_old', result.actionId], 'and stored');
});

test('the queue is bounded: past 200 actions the oldest are dropped first and counted', async () => {
  const wx = new FakeWx();
  const errors = [];
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER },
    onError: (e) => errors.push(e.code) });
  const old = Array.from({ length: 200 }, (_, i) => ({ id: `wc_${i}`, type: 'checkin', awaitingTap: false,
    path: '/v1/reminders/water/checkins', createdAt: Date.now() - 1000 + i, body: { action_id: `wc_${i}` } }));
  wx.setStorageSync(client.keys.queue, old);
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  const ids = client.queue().map((i) => i.id);
  assert.equal(ids.length, 200);
  assert.equal(ids[0], 'wc_1', 'the oldest went first');
  assert.equal(ids[199], result.actionId, 'the new one is kept');
  assert.equal(client.droppedCount(), 1);
  assert.ok(errors.includes('dropped'));
});

test('configuration errors are surfaced at once, from a submit or a prefetch, and not retried', async () => {
  const DOMAIN = 'request:fail url not in domain list';
  const TLS = 'request:fail ssl hand shake error';
  for (const [errMsg, lifted] of [[DOMAIN, false], [TLS, true]]) {
    const wx = new FakeWx();
    // The session works (another domain, say); the API's submits fail.
    const server = accepting((method, path) => (path.endsWith('/checkins') ? { fail: errMsg } : undefined));
    const errors = [];
    const client = online(wx, server, { onError: (e) => errors.push(e) });
    cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
    const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
    assert.equal(result.queued, true, 'the action is kept for a fixed release');
    assert.equal(result.configurationError.code, 'configuration', 'the result says why it waits');
    assert.deepEqual(errors.map((e) => e.code), ['configuration'], errMsg);
    assert.equal(errors[0].retryable, false);
    const tries = () => server.log.filter((r) => r.path.endsWith('/checkins')).length;
    await wx.tap(() => client.checkIn('water', { count: 2, goal: 8 }));
    await client.flush();
    assert.equal(tries(), 1, 'nothing more sent');
    // A new network: a TLS error (a captive portal, a wrong clock) gets one more try; a
    // domain missing from the request domains holds until the next launch.
    wx.network(true);
    for (let i = 0; i < 50 && tries() < 2; i += 1) await later(5);
    await later(20);
    assert.equal(tries(), lifted ? 2 : 1, errMsg);
    assert.equal(client.pendingCount(), 2);
  }
  // Met first by a prefetch, with nothing queued: reported all the same.
  const wx = new FakeWx();
  const errors = [];
  const client = online(wx, scripted(() => ({ fail: DOMAIN })), { onError: (e) => errors.push(e.code) });
  const fetched = await client.prefetch();
  assert.equal(fetched.fresh, false);
  assert.deepEqual(errors, ['configuration']);
  assert.equal(client.configurationError().code, 'configuration');
  assert.equal(new OnegrantError(0, 'network', 'request:fail timeout').retryable, true);
});

test('two pages flushing one queue submit each action once, in the order it was made', async () => {
  const wx = new FakeWx();
  const server = accepting();
  const slow = (o) => setTimeout(() => server.request(o), 15);
  const a = online(wx, server, { request: slow });
  const b = online(wx, server, { request: slow });
  cachePlans(wx, a, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const queue = [0, 1, 2].map((i) => ({ id: `wc_q${i}`, type: 'checkin', path: '/v1/reminders/water/checkins',
    awaitingTap: false, createdAt: Date.now() - 100 + i, body: { action_id: `wc_q${i}` } }));
  wx.setStorageSync(a.keys.queue, queue);
  const flushes = await Promise.all([a.flush(), b.flush(), a.flush(), b.flush()]);
  assert.deepEqual(checkins(server), ['wc_q0', 'wc_q1', 'wc_q2'], 'once each, in order');
  assert.ok(flushes.every((f) => f.pending === 0));
  for (const f of flushes) assert.equal(f.answers.wc_q2.data.echo, 'wc_q2', 'every page hears every answer');
});

test('an action whose popup is open holds back the ones after it', async () => {
  const wx = new FakeWx();
  wx.holdPopups = true;
  const server = accepting();
  const a = online(wx, server);
  const b = online(wx, server);
  cachePlans(wx, a, { water: { kind: 'water', template_id: WATER, needs_grant: true } });
  const first = wx.tap(() => a.checkIn('water', { count: 1, goal: 8 }));
  cachePlans(wx, b, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const second = await wx.tap(() => b.checkIn('water', { count: 2, goal: 8 }));
  assert.equal(second.queued, true, 'waits behind the open popup');
  assert.deepEqual(checkins(server), []);
  wx.held('accept');
  const answered = await first;
  assert.deepEqual(checkins(server), [answered.actionId, second.actionId]);
  assert.equal(server.log.find((r) => r.path.endsWith('/checkins')).body.subscription_status, 'accept');
});

test('a Retry-After ending, the network coming back and the app shown each submit the queue without a tap', async () => {
  // Retry-After: 1 — submitted again a second later by the client's own timer.
  let busy = true;
  const wx = new FakeWx();
  const server = accepting((method, path) => (busy && path.endsWith('/checkins')
    ? { status: 503, data: { error: { code: 'unavailable' } }, header: { 'Retry-After': '1' } } : undefined));
  const client = online(wx, server);
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const first = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(first.queued, true);
  busy = false;
  for (let i = 0; i < 100 && client.pendingCount() > 0; i += 1) await later(50);
  assert.equal(client.pendingCount(), 0, 'sent when the Retry-After ended');
  assert.deepEqual(checkins(server), [first.actionId, first.actionId]);

  // Offline, then the network returns; then offline again, and the app is shown.
  for (const [name, recover] of [['network', (w) => w.network(true)], ['app show', (w) => w.appShow()]]) {
    let down = true;
    const phone = new FakeWx();
    const net = accepting((method, path) => (down && path.endsWith('/checkins') ? null : undefined));
    const page = online(phone, net);
    cachePlans(phone, page, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
    const offline = await phone.tap(() => page.checkIn('water', { count: 1, goal: 8 }));
    assert.equal(offline.queued, true);
    down = false;
    recover(phone);
    for (let i = 0; i < 100 && page.pendingCount() > 0; i += 1) await later(10);
    assert.equal(page.pendingCount(), 0, `sent on ${name}`);
  }
});

test('a retryAt further off than any server asks (a clock set back) does not hold the queue', async () => {
  const wx = new FakeWx();
  const server = accepting();
  const client = online(wx, server);
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  wx.setStorageSync(client.keys.retryAt, Date.now() + 24 * 3600e3);
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.queued, false);
  // A real Retry-After still holds it.
  wx.setStorageSync(client.keys.retryAt, Date.now() + 60e3);
  const held = await wx.tap(() => client.checkIn('water', { count: 2, goal: 8 }));
  assert.equal(held.queued, true);
});

test('a host-supplied session: wx.login is never called, and a 401 asks the host once more', async () => {
  const wx = new FakeWx();
  let refuse = 'host-1';
  const server = accepting((method, path, body) => {
    if (path === '/v1/session') throw new Error('onegrant must not log in itself');
    return undefined;
  });
  const authorised = (o) => {
    if (o.header.Authorization === `Bearer ${refuse}`) {
      server.log.push({ method: o.method, path: o.url, refused: true });
      setTimeout(() => o.success({ statusCode: 401, data: { error: { code: 'unauthorized' } }, header: {} }), 0);
      return;
    }
    server.request(o);
  };
  let asked = 0;
  const client = createClient({
    baseUrl: 'http://127.0.0.1:9', wx, request: authorised, templates: { water: WATER },
    login: () => { throw new Error('wx.login called'); },
    session: () => { asked += 1; return Promise.resolve({ token: `host-${asked}`, expires_in: 7200 }); },
  });
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.queued, false);
  assert.equal(asked, 2, 'the refused token replaced once');
  assert.equal(server.log.filter((r) => r.auth === 'Bearer host-2').length, 1);
});

test('errors keep retryable as their own property, through a spread and JSON', () => {
  const error = new OnegrantError(503, 'unavailable', 'x', 5);
  assert.equal({ ...error }.retryable, true);
  assert.equal(JSON.parse(JSON.stringify(error)).retryable, true);
  assert.equal(Object.prototype.hasOwnProperty.call(new OnegrantError(422, 'invalid_count'), 'retryable'), true);
});

test('pages passing their own storage adapters still share one app: one flush, one memory', async () => {
  const wx = new FakeWx();
  const server = accepting();
  const adapter = () => ({ getStorageSync: (k) => wx.getStorageSync(k), setStorageSync: (k, v) => wx.setStorageSync(k, v) });
  const slow = (o) => setTimeout(() => server.request(o), 10);
  const a = online(wx, server, { storage: adapter(), request: slow });
  const b = online(wx, server, { storage: adapter(), request: slow });
  wx.setStorageSync(a.keys.queue, [0, 1].map((i) => ({ id: `wc_${i}`, type: 'checkin', awaitingTap: false,
    path: '/v1/reminders/water/checkins', createdAt: Date.now() - 10 + i, body: { action_id: `wc_${i}` } })));
  await Promise.all([a.flush(), b.flush(), a.flush()]);
  assert.deepEqual(checkins(server), ['wc_0', 'wc_1']);
});

test('callers arriving during a failing flush share one wait and no extra tries', async () => {
  const wx = new FakeWx();
  const server = accepting((method, path) => (path.endsWith('/checkins') ? { fail: 'request:fail timeout', delay: 30 } : undefined));
  const client = online(wx, server);
  wx.setStorageSync(client.keys.queue, [{ id: 'wc_0', type: 'checkin', awaitingTap: false,
    path: '/v1/reminders/water/checkins', createdAt: Date.now(), body: { action_id: 'wc_0' } }]);
  const flushes = await Promise.all(Array.from({ length: 6 }, () => client.flush()));
  assert.equal(checkins(server).length, 1, 'one try, not one per caller');
  assert.ok(flushes.every((f) => f.pending === 1));
});

test('a host session that answers badly or the refused token again is reported, not retried in silence', async () => {
  const server = accepting();
  const refusing = (o) => {
    if (o.header.Authorization === 'Bearer same') {
      setTimeout(() => o.success({ statusCode: 401, data: { error: { code: 'unauthorized' } }, header: {} }), 0);
      return;
    }
    server.request(o);
  };
  const asked = [];
  const errors = [];
  const wx = new FakeWx();
  const client = createClient({
    baseUrl: 'http://127.0.0.1:9', wx, request: refusing, templates: { water: WATER },
    onError: (e) => errors.push(e.code),
    session: (why) => { asked.push(why); return Promise.resolve({ token: 'same', expires_in: 600 }); },
  });
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const first = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(first.queued, true);
  assert.deepEqual(asked, [{ refused: null }, { refused: 'same' }], 'told which token was refused');
  await client.flush();
  await client.flush();
  assert.deepEqual(errors, ['unauthorized'], 'reported once in this app run');
  // No token, or no lifetime: a configuration error, reported at once.
  for (const answer of [{ data: { token: 't' } }, { token: 't' }]) {
    const phone = new FakeWx();
    const seen = [];
    const hosted = createClient({ baseUrl: 'http://127.0.0.1:9', wx: phone, request: server.request,
      onError: (e) => seen.push(e.code), session: () => Promise.resolve(answer) });
    await assert.rejects(hosted.getPlan('water'), (e) => e.code === 'configuration');
    assert.deepEqual(seen, ['configuration'], JSON.stringify(answer));
  }
});

test('a storage whose reads fail after writes worked reads back what was written: no new login, no lost cache', async () => {
  const wx = new FakeWx();
  let logins = 0;
  const server = accepting();
  const client = online(wx, server, { login: (o) => { logins += 1; o.success({ code: 'c' }); } });
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  wx.setStorageSync(client.keys.cache, Object.assign(wx.getStorageSync(client.keys.cache), { setting: { main_switch: true, item_settings: {} } }));
  await client.getPlan('water');
  assert.equal(logins, 1);
  wx.readFails = true;
  await client.getPlan('water');
  await client.quotas();
  assert.equal(logins, 1, 'the session written is read back');
  wx.readFails = false;
  assert.deepEqual(wx.getStorageSync(client.keys.cache).setting, { main_switch: true, item_settings: {} },
    'the cache was not rebuilt from nothing');
});

test('while stored actions cannot be read, a newer one waits: the order holds', async () => {
  const wx = new FakeWx();
  const server = accepting();
  const first = online(wx, server);
  wx.setStorageSync(first.keys.queue, [{ id: 'wc_old', type: 'checkin', awaitingTap: false,
    path: '/v1/reminders/water/checkins', createdAt: Date.now() - 10, body: { action_id: 'wc_old' } }]);
  // A new app run (a fresh wx over the same storage) whose reads fail.
  const relaunched = new FakeWx({ store: wx.store, request: server.request });
  const client = online(relaunched, server);
  relaunched.readFails = true;
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const result = await relaunched.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.queued, true);
  assert.deepEqual(checkins(server), [], 'nothing sent ahead of the unread one');
  relaunched.readFails = false;
  await client.flush();
  assert.deepEqual(checkins(server), ['wc_old', result.actionId]);
});

test('a full queue drops the oldest action carrying no accepted grant before one that does', async () => {
  const wx = new FakeWx();
  const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER } });
  const item = (i, grant) => ({ id: `wc_${i}`, type: 'checkin', awaitingTap: false, path: '/v1/reminders/water/checkins',
    createdAt: Date.now() - 1000 + i,
    body: Object.assign({ action_id: `wc_${i}` }, grant ? { grant_request_id: `wr_${i}`, subscription_status: 'accept' } : {}) });
  wx.setStorageSync(client.keys.queue, Array.from({ length: 200 }, (_, i) => item(i, i < 2)));
  await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  const ids = client.queue().map((i) => i.id);
  assert.deepEqual(ids.slice(0, 3), ['wc_0', 'wc_1', 'wc_3'], 'wc_2, the oldest without a grant, went');
});

test('corrupt cache values neither stop the popup nor suppress it', async () => {
  for (const cache of [
    { quotas: 'x', plans: { water: { kind: 'water', template_id: WATER, needs_grant: true, refill_template_id: 'tmpl_r' } } },
    { plans: { water: 'paused' } },
    { plans: [], setting: 'off' },
    'garbage',
  ]) {
    const wx = new FakeWx();
    const client = createClient({ baseUrl: 'http://127.0.0.1:9', wx, templates: { water: WATER } });
    wx.setStorageSync(client.keys.cache, cache);
    const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
    assert.equal(result.asked, true, JSON.stringify(cache));
    assert.equal(wx.subscribeCalls.length, 1);
    assert.equal(client.queue()[0].body.action_id, result.actionId, 'recorded');
  }
});

test('a queue held by a stored retryAt or an open popup is tried again when that ends, without a call', async () => {
  const wx = new FakeWx();
  const server = accepting();
  const client = online(wx, server);
  wx.setStorageSync(client.keys.queue, [{ id: 'wc_0', type: 'checkin', awaitingTap: false,
    path: '/v1/reminders/water/checkins', createdAt: Date.now(), body: { action_id: 'wc_0' } }]);
  wx.setStorageSync(client.keys.retryAt, Date.now() + 300); // left by the last app run
  await client.flush();
  assert.equal(client.pendingCount(), 1);
  for (let i = 0; i < 100 && client.pendingCount() > 0; i += 1) await later(20);
  assert.deepEqual(checkins(server), ['wc_0'], 'sent when the retryAt passed');
});

test('a request that never answers is given up after its timeout and the action stays queued', async () => {
  const wx = new FakeWx();
  const silent = [];
  const client = createClient({
    baseUrl: 'http://127.0.0.1:9', wx, timeout: 50, templates: { water: WATER },
    request: (o) => { silent.push(o.url); },            // no success, no fail, ever
    login: (o) => o.success({ code: 'c' }),
  });
  wx.setStorageSync(client.keys.session, { token: 't', expiresAt: Date.now() + 3600e3 });
  cachePlans(wx, client, { water: { kind: 'water', template_id: WATER, needs_grant: false } });
  const result = await wx.tap(() => client.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.queued, true);
  assert.equal(silent.length, 1);
  assert.equal(client.queue()[0].body.action_id, result.actionId, 'kept, with its id');
});

test('a check-in answered as a replay leaves the cached plan alone and no longer fresh', async () => {
  const wx = new FakeWx();
  let now = T0;
  const old = { kind: 'water', template_id: WATER, state: 'scheduled', needs_grant: false,
    next_due_at: new Date(T0 - 3600e3).toISOString() };
  const server = accepting((method, path) => (path.endsWith('/checkins')
    ? { status: 200, data: old, header: { 'Idempotent-Replayed': 'true' } } : undefined));
  const client = online(wx, server, { now: () => now });
  const current = { kind: 'water', template_id: WATER, state: 'scheduled', needs_grant: false,
    next_due_at: new Date(T0 + 3600e3).toISOString() };
  cachePlans(wx, client, { water: current });
  assert.equal(client.needsGrant('water'), false, 'fresh, a grant held, not yet due');
  // An action whose answer was lost, sent again: the server answers its first answer.
  wx.setStorageSync(client.keys.queue, [{ id: 'wc_again', type: 'checkin', path: '/v1/reminders/water/checkins',
    awaitingTap: false, createdAt: now - 100, body: { action_id: 'wc_again' } }]);
  const flushed = await client.flush();
  assert.equal(flushed.pending, 0);
  assert.deepEqual(client.cachedPlan('water'), current, 'the plan as it was then is not cached');
  assert.equal(client.needsGrant('water'), true, 'the plan cached is no longer taken as fresh');
  // A check-in applied now is cached as the plan now.
  const fresh = accepting();
  const again = online(wx, fresh, { now: () => now });
  wx.setStorageSync(again.keys.queue, [{ id: 'wc_new', type: 'checkin', path: '/v1/reminders/water/checkins',
    awaitingTap: false, createdAt: now - 100, body: { action_id: 'wc_new' } }]);
  await again.flush();
  assert.equal(again.cachedPlan('water').echo, 'wc_new');
});
