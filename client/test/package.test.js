'use strict';
// The package as a mini-program gets it: what "构建 npm" in WeChat DevTools builds from
// it (the `miniprogram` directory's packed files copied into
// miniprogram_npm/onegrant-miniprogram/), loaded the way a mini-program loads it
// (`require('onegrant-miniprogram')` is that directory's index.js; relative requires
// only; no Node; no `globalThis`, as on old iOS base libraries; `wx` a global), then the
// README's first example run as written. And the typings against the code.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const vm = require('node:vm');
const { FakeWx, cachePlans } = require('./fake-wx.js');

const root = path.resolve(__dirname, '..');
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));

/** "构建 npm": the packed files (package.json's `files`) of the `miniprogram` directory,
 *  copied into a fresh miniprogram_npm/<name>/. Answers that directory. */
function buildNpm() {
  assert.equal(typeof pkg.miniprogram, 'string', 'package.json names its miniprogram directory');
  const source = path.resolve(root, pkg.miniprogram);
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'mp-')), 'miniprogram_npm', pkg.name);
  fs.mkdirSync(out, { recursive: true });
  for (const file of pkg.files) {
    const from = path.join(root, file);
    if (!from.startsWith(source + path.sep) && from !== source) continue;
    fs.copyFileSync(from, path.join(out, path.relative(source, from)));
  }
  return out;
}

/** A mini-program's module loader over `dir`: CommonJS with relative requires only, in
 *  a context that has `wx`, timers and no `globalThis`. Answers `require`. */
function miniProgram(dir, wx) {
  const context = vm.createContext({ wx, setTimeout, clearTimeout, console });
  vm.runInContext('delete globalThis;', context);
  assert.equal(vm.runInContext('typeof globalThis', context), 'undefined', 'no globalThis, as on old iOS');
  const cache = new Map();
  const load = (file) => {
    if (cache.has(file)) return cache.get(file).exports;
    if (!fs.existsSync(file)) throw new Error(`${path.basename(file)} is not in the built package`);
    const module = { exports: {} };
    cache.set(file, module);
    const wrapped = vm.runInContext(
      `(function (module, exports, require) {${fs.readFileSync(file, 'utf8')}\n})`, context, { filename: file },
    );
    const local = (request) => {
      if (!request.startsWith('./') && !request.startsWith('../')) {
        throw new Error(`${path.basename(file)} requires ${request}: a mini-program package has no dependencies`);
      }
      const target = path.resolve(path.dirname(file), request);
      return load(target.endsWith('.js') ? target : `${target}.js`);
    };
    wrapped(module, module.exports, local);
    return module.exports;
  };
  return (name) => {
    assert.equal(name, pkg.name);
    return load(path.join(dir, 'index.js'));
  };
}

test('what 构建 npm builds resolves require(\'onegrant-miniprogram\') and the README\'s first example works', async () => {
  const built = buildNpm();
  assert.ok(fs.existsSync(path.join(built, 'index.js')), 'index.js: what a mini-program require resolves');
  const wx = new FakeWx();
  const requireMp = miniProgram(built, wx);
  const { createClient } = requireMp('onegrant-miniprogram');
  assert.equal(typeof createClient, 'function');
  // The README: wx found globally, nothing else given.
  const onegrant = createClient({ baseUrl: 'https://api.example.com', templates: { water: 'tmpl_water' } });
  cachePlans(wx, onegrant, { water: { kind: 'water', template_id: 'tmpl_water', needs_grant: true } });
  const result = await wx.tap(() => onegrant.checkIn('water', { count: 1, goal: 8 }));
  assert.equal(result.asked, true);
  assert.equal(result.result, 'accept');
  assert.equal(JSON.stringify(wx.subscribeCalls), JSON.stringify([{ tmplIds: ['tmpl_water'], inGesture: true }]));
  assert.equal(result.queued, true, 'no network here: kept');
});

test('every library file is packed, and no library file needs globalThis', () => {
  const library = fs.readdirSync(root).filter((f) => f.endsWith('.js'));
  for (const file of library) {
    assert.ok(pkg.files.includes(file), `${file} is not in package.json's files`);
    const code = fs.readFileSync(path.join(root, file), 'utf8').replace(/\/\/.*$|\/\*[\s\S]*?\*\//gm, '');
    assert.doesNotMatch(code, /\bglobalThis\b/, `${file} uses globalThis`);
  }
});

test('the typings declare exactly the client\'s public methods, and the codes the library uses', () => {
  const { Client, ERROR_CODES, SUBSCRIBE_FAILURES } = require('../onegrant.js');
  const typings = fs.readFileSync(path.join(root, 'onegrant.d.ts'), 'utf8');
  const declared = new Set();
  const body = typings.slice(typings.indexOf('export class Client {'));
  const block = body.slice(0, body.indexOf('\n}\n'));
  for (const match of block.matchAll(/^ {2}([a-zA-Z]+)\(/gm)) if (match[1] !== 'constructor') declared.add(match[1]);
  for (const name of declared) {
    assert.equal(typeof Client.prototype[name], 'function', `onegrant.d.ts declares Client.${name}, which does not exist`);
  }
  const PUBLIC = [
    'prefetch', 'needsGrant', 'asks', 'subscriptionsSetting', 'standingOf', 'refreshSetting', 'cachedPlan',
    'cachedQuotas', 'getPlan', 'updatePlan', 'quotas', 'checkIn', 'requestGrants', 'flush', 'pendingCount',
    'droppedCount', 'configurationError', 'notifications', 'unreadCount', 'markRead', 'markAllRead',
    'getPreferences', 'setPreferences', 'erase', 'exportData',
  ];
  assert.deepEqual([...declared].sort(), [...PUBLIC].sort());
  // Every method of the client is either public (declared) or internal (listed here): a
  // new one must be placed, and a public one typed.
  const INTERNAL = [
    'constructor', 'read', 'write', 'cache', 'rememberPlan', 'remember', 'send', 'token', 'relogin',
    'loginSession', 'hostSession', 'call', 'callAnswer', 'misconfigured', 'needsGrantOf', 'subscribe', 'report',
    'settleRefill', 'queue', 'changeQueue', 'enqueue', 'updateQueued', 'queued', 'dequeue', 'queueStored',
    'enqueueReport', 'settle', 'recentAnswers', 'reportOnce', 'flushSoon', 'flushIn', 'listen', 'keepGrant',
    'afterAnswer', 'withSetting',
  ];
  const methods = Object.getOwnPropertyNames(Client.prototype).filter((n) => typeof Client.prototype[n] === 'function');
  for (const name of methods) {
    assert.ok(PUBLIC.includes(name) || INTERNAL.includes(name), `Client.${name} is neither public nor internal`);
  }
  for (const code of ERROR_CODES) assert.match(typings, new RegExp(`'${code}'`), `ErrorCode lacks ${code}`);
  for (const reason of new Set(Object.values(SUBSCRIBE_FAILURES))) {
    assert.match(typings, new RegExp(`'${reason}'`), `SubscribeFailureReason lacks ${reason}`);
  }
  // The grant status as the API answers it.
  const openapi = fs.readFileSync(path.join(root, '..', 'api', 'openapi.yaml'), 'utf8');
  const grant = openapi.slice(openapi.indexOf('\n    Grant:'), openapi.indexOf('\n    Quota:'));
  const statuses = grant.match(/enum: \[available, reserved, consumed, invalid, not_granted\]/);
  assert.ok(statuses, 'the API\'s grant statuses changed: update GrantStatus');
  assert.match(typings, /export type GrantStatus = 'available' \| 'reserved' \| 'consumed' \| 'invalid' \| 'not_granted';/);
});
