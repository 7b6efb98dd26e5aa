"""Fuzzes the local stack against api/openapi.yaml with schemathesis.

Starts `onegrant-local` (the binary given as the first argument) on free ports with its
own emulator and the WeChat stand-in, signs users in, gives each a grant and turns its
water reminder on, then runs schemathesis over every operation with their tokens:
all checks, a fixed seed, at least MIN_CASES generated cases. The schema is the
contract the stack serves (/openapi.json: api/openapi.yaml with the configured template
ids and reminder kinds and the zone database's names filled in), so every rejection of
a schema-valid request is a failure. scripts/fuzz_hooks.py leaves out the cases the
contract refuses in words where a schema cannot say it (each named there).

The publisher API's routes are fuzzed signed: schemathesis talks to a small proxy
that passes every request through to the stack unchanged, but for a `/publisher/`
request carrying the scheme's header, whose signature headers it replaces with the
local publisher's over the exact bytes it forwards (one sent without it stays
unsigned: schemathesis's own check that it is refused).

The fuzzed user is really USERS users, each set up alike: the proxy hands each request
carrying the token schemathesis was given to the next of them in turn, so that no
user's per-minute limits are met on a machine of any speed (one user met them for
most cases of some routes, and which ones hung on the machine's speed: a route's
logic was fuzzed on a slow machine and not on a fast one). And they are never erased:
`DELETE /v1/me` goes with a fresh user's token instead (signed in for that call), so
each erasure is a real one and every case after it still reaches the routes' logic
(erasing the fuzzed user at its first such case left three fifths of the run
answering 401).

One check is left out, on purpose: `unsupported_method` wants 405 for a method a path
does not declare; API Gateway answers 404 for a route it does not have, and so does
the local stack (the contract says so).

Usage: .venv/bin/python scripts/fuzz.py target/debug/onegrant-local
"""

import hashlib
import hmac
import http.client
import http.server
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

MIN_CASES = 2000
USERS = 16
MAX_EXAMPLES = "150"
SEED = "1"


def printed_port(printed, label):
    """The port onegrant-local printed for `label` (it binds port 0 to a free one)."""
    match = re.search(label + r"\s+http://127\.0\.0\.1:(\d+)", printed)
    if match is None:
        raise SystemExit(f"fuzz: the local stack printed no {label} address")
    return int(match.group(1))


# The local stack's default publisher (onegrant_local::stack::LOCAL_PUBLISHER).
PUBLISHER = ("com.example.shop", b"local-publisher-secret")
# Hop-by-hop headers, and the ones the forwarding connection sets itself.
NOT_FORWARDED = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}


def signing_proxy(api_port, token, tokens, sign_in):
    """A proxy on a free port passing every request to the API on `api_port` as it
    came, but signing `/publisher/` requests as the local publisher and giving a
    request carrying `token` the next of `tokens` in turn, or for an erasure a fresh
    user's token from `sign_in()`: (port, server)."""
    turns = itertools.cycle(tokens)
    lock = threading.Lock()

    def stand_in_for(method, path):
        if method == "DELETE" and path == "/v1/me":
            return sign_in()
        with lock:
            return next(turns)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The answer's headers and body go out in separate writes: without this, each
        # would wait out the client's delayed ACK (40 ms a case, minutes a run).
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def forward(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in NOT_FORWARDED}
            path, _, query = self.path.partition("?")
            # Signed in place of the key schemathesis sends (the `publisher` scheme's
            # header); a request it sends without one (its auth checks) stays unsigned.
            sent_a_key = any(k.lower() == "x-onegrant-signature" for k in headers)
            headers = {
                k: (
                    f"Bearer {stand_in_for(self.command, path)}"
                    if k.lower() == "authorization" and v == f"Bearer {token}"
                    else v
                )
                for k, v in headers.items()
            }
            if path.startswith("/publisher/") and sent_a_key:
                headers = {k: v for k, v in headers.items() if not k.lower().startswith("x-onegrant-")}
                timestamp = str(int(time.time()))
                target = urllib.parse.unquote(path) + ("?" + query if query else "")
                signed = f"{timestamp}.{self.command}.{target}.".encode() + body
                digest = hmac.new(PUBLISHER[1], signed, hashlib.sha256).hexdigest()
                headers["x-onegrant-publisher"] = PUBLISHER[0]
                headers["x-onegrant-timestamp"] = timestamp
                headers["x-onegrant-signature"] = "v1=" + digest
            connection = http.client.HTTPConnection("127.0.0.1", api_port, timeout=60)
            try:
                connection.request(self.command, self.path, body=body or None, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in NOT_FORWARDED:
                        self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            finally:
                connection.close()

        def __getattr__(self, name):
            # Every method, the odd ones schemathesis tries too (QUERY, …): passed on.
            if name.startswith("do_"):
                return self.forward
            raise AttributeError(name)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1], server


def call(method, url, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def main():
    binary = os.path.abspath(sys.argv[1])
    # Port 0 for each: the stack binds free ones and prints them (stacks started side
    # by side, as the client's tests beside this, never race for a port).
    env = dict(
        os.environ,
        ONEGRANT_API_PORT="0",
        ONEGRANT_INVOKE_PORT="0",
        ONEGRANT_STANDIN_PORT="0",
        ONEGRANT_LOCAL_TICK_SECONDS="0",
        RUST_LOG="error",
        # The per-user limits at their widest (reads unlimited), as well as USERS users
        # taking turns: which cases meet 429 must not hang on the machine's speed. The
        # limits themselves are the suite's to test (limits::).
        READS_PER_MINUTE="0",
        CHANGES_PER_MINUTE="600",
        REPORTS_PER_MINUTE="600",
        CHECKINS_PER_MINUTE="600",
    )
    for name in ("AWS_ENDPOINT_URL_DYNAMODB", "WECHAT_API_BASE", "WECHAT_PUSH_TOKEN"):
        env.pop(name, None)
    stack = subprocess.Popen(
        [binary], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        deadline = time.monotonic() + 120
        printed = ""
        for line in stack.stdout:
            printed += line
            if "Ctrl-C stops everything" in line:
                break
            if time.monotonic() > deadline:
                raise SystemExit("fuzz: the local stack did not start")
        api, standin = printed_port(printed, "HTTP API"), printed_port(printed, "WeChat stand-in")
        base = f"http://127.0.0.1:{api}"
        users = iter(range(1_000_000))

        def sign_in(user="fuzz"):
            login = call("POST", f"http://127.0.0.1:{standin}/control/login-codes", {"user": user})
            return call("POST", f"{base}/v1/session", {"code": login["code"]})["token"]

        def set_up(user):
            token = sign_in(user)
            call("POST", f"{base}/v1/grants", {"request_id": "fuzz_1", "results": {"tmpl_water_reminder": "accept"}}, token)
            call("PUT", f"{base}/v1/reminders/water", {"enabled": True}, token)
            return token

        tokens = [set_up(f"fuzz_{i}") for i in range(USERS)]
        token = tokens[0]

        # The contract as this deployment serves it: the configured template ids and
        # reminder kinds and the zone database's names filled in.
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(call("GET", f"{base}/openapi.json"), f)
            schema_path = f.name
        tool = os.path.join(os.path.dirname(sys.executable), "schemathesis")
        proxy_port, proxy = signing_proxy(api, token, tokens, lambda: sign_in(f"erased_{next(users)}"))
        command = [
            tool, "run", schema_path,
            "--url", f"http://127.0.0.1:{proxy_port}",
            "-H", f"Authorization: Bearer {token}",
            "--checks", "all",
            "--exclude-checks", "unsupported_method",
            "--seed", SEED,
            "--max-examples", MAX_EXAMPLES,
            "--workers", "1",
        ]
        hooks = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_hooks.py")
        run = subprocess.run(
            command, capture_output=True, text=True, env=dict(env, SCHEMATHESIS_HOOKS=hooks)
        )
        output = run.stdout + run.stderr
        print(output)
        generated = re.search(r"(\d+) generated", output)
        cases = int(generated.group(1)) if generated else 0
        if run.returncode != 0:
            raise SystemExit(f"fuzz: schemathesis found failures (exit {run.returncode})")
        if cases < MIN_CASES:
            raise SystemExit(f"fuzz: only {cases} cases generated, fewer than {MIN_CASES}")
        print(f"fuzz: {cases} cases, no failures")
    finally:
        if "proxy" in locals():
            proxy.shutdown()
        stack.send_signal(signal.SIGTERM)
        try:
            stack.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stack.kill()


if __name__ == "__main__":
    main()
