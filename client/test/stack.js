'use strict';
// The real local stack for the integration tests: `onegrant-local` (built by cargo; its
// path in ONEGRANT_LOCAL_BIN, else $CARGO_TARGET_DIR/debug or target/debug) on the free
// ports it picks and prints, with its own DynamoDB
// emulator and WeChat stand-in, and wx adapters that reach it over real HTTP.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

/** The port `onegrant-local` printed for `label` (it binds port 0 to a free one). */
function printedPort(printed, label) {
  const match = printed.match(new RegExp(`${label}\\s+http://127\\.0\\.0\\.1:(\\d+)`));
  if (!match) throw new Error(`onegrant-local printed no ${label} address`);
  return match[1];
}

async function startStack() {
  const root = path.resolve(__dirname, '..', '..');
  const target = process.env.CARGO_TARGET_DIR ? path.resolve(root, process.env.CARGO_TARGET_DIR) : path.join(root, 'target');
  const binary = process.env.ONEGRANT_LOCAL_BIN || path.join(target, 'debug', 'onegrant-local');
  if (!fs.existsSync(binary)) {
    throw new Error(`${binary} is missing: build it first with \`cargo build --bin onegrant-local\` `
      + '(or run scripts/test, which builds it), or set ONEGRANT_LOCAL_BIN to its path');
  }
  // Port 0 for each: the stack binds free ones and prints them (stacks started side by
  // side, as the fuzzer's beside these tests, never race for a port).
  const env = Object.assign({}, process.env, {
    ONEGRANT_API_PORT: '0',
    ONEGRANT_INVOKE_PORT: '0',
    ONEGRANT_STANDIN_PORT: '0',
    ONEGRANT_LOCAL_TICK_SECONDS: '0',
    RUST_LOG: 'error',
  });
  for (const name of ['AWS_ENDPOINT_URL_DYNAMODB', 'WECHAT_API_BASE', 'WECHAT_PUSH_TOKEN']) delete env[name];
  const child = spawn(binary, [], { cwd: root, env, stdio: ['pipe', 'pipe', 'ignore'] });
  const printed = await new Promise((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => reject(new Error('the local stack did not start in 120 s')), 120000);
    child.on('exit', (code) => reject(new Error(`onegrant-local exited with ${code}`)));
    child.on('error', (err) => { clearTimeout(timer); reject(new Error(`${binary} could not start: ${err.message}`)); });
    child.stdout.on('data', (chunk) => {
      seen += chunk.toString();
      if (seen.includes('Ctrl-C stops everything')) {
        clearTimeout(timer);
        resolve(seen);
      }
    });
  });
  child.stdout.resume();
  const [api, invoke, standin] = ['HTTP API', 'Invoke API', 'WeChat stand-in'].map((l) => printedPort(printed, l));
  return {
    api: `http://127.0.0.1:${api}`,
    standin: `http://127.0.0.1:${standin}`,
    invoke: `http://127.0.0.1:${invoke}`,
    stop() {
      return new Promise((resolve) => {
        child.removeAllListeners('exit');
        child.on('exit', () => resolve());
        child.kill('SIGTERM');
      });
    },
  };
}

/**
 * wx.request over real HTTP (fetch). `net.offline` fails every request without sending
 * it; `net.dropAnswer(request)` sends it (the server commits) and then reports the
 * answer lost. Every request that reached the server is in `net.log`.
 */
function httpRequest(net) {
  return (options) => {
    const { url, method, data, header, success, fail } = options;
    if (net.offline) {
      setTimeout(() => fail({ errMsg: 'request:fail net::ERR_INTERNET_DISCONNECTED' }), 0);
      return;
    }
    fetch(url, { method, headers: header, body: data === undefined ? undefined : JSON.stringify(data) })
      .then(async (res) => {
        const text = await res.text();
        let body = text;
        try { body = JSON.parse(text); } catch (e) { /* not JSON */ }
        const headers = {};
        res.headers.forEach((value, key) => { headers[key] = value; });
        const entry = { method, path: new URL(url).pathname, body: data, status: res.status, auth: header.Authorization };
        net.log.push(entry);
        if (net.afterAnswer) net.afterAnswer(entry);
        if (net.dropAnswer && net.dropAnswer(entry)) {
          fail({ errMsg: 'request:fail socket hang up' });
          return;
        }
        success({ statusCode: res.status, data: body, header: headers });
      })
      .catch((e) => fail({ errMsg: `request:fail ${e.message}` }));
  };
}

/** wx.login against the stand-in: a fresh code of `user` each time (counted). */
function standinLogin(stack, user, counter) {
  return (options) => {
    counter.logins += 1;
    fetch(`${stack.standin}/control/login-codes`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ user }),
    })
      .then((res) => res.json())
      .then((body) => {
        counter.openid = body.openid;
        options.success({ code: body.code });
      }, (e) => options.fail({ errMsg: e.message }));
  };
}

/** Publishes a notify event through the stack's Invoke API, as EventBridge would. */
async function notify(stack, detail) {
  const event = {
    version: '0', id: 'e', 'detail-type': 'onegrant.notification', source: 'client-tests',
    account: '1', time: new Date().toISOString(), region: 'us-east-1', resources: [], detail,
  };
  const res = await fetch(`${stack.invoke}/2015-03-31/functions/NotifyFunction/invocations`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(event),
  });
  return res.json();
}

/** One dispatcher tick through the Invoke API, as the schedule runs it; its summary. */
async function tick(stack) {
  const event = {
    version: '0', id: 't', 'detail-type': 'Scheduled Event', source: 'aws.events', account: '1',
    time: new Date().toISOString(), region: 'us-east-1', resources: [], detail: {},
  };
  const res = await fetch(`${stack.invoke}/2015-03-31/functions/DispatcherFunction/invocations`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(event),
  });
  return res.json();
}

module.exports = { startStack, httpRequest, standinLogin, notify, tick };
