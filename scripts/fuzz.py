"""Fuzzes the local stack against api/openapi.yaml with schemathesis.

Starts `onegrant-local` (the binary given as the first argument) on free ports with its
own emulator and the WeChat stand-in, signs a user in, gives it a grant and turns its
water reminder on, then runs schemathesis over every operation with that user's token:
all checks, a fixed seed, at least MIN_CASES generated cases. The schema is the
contract the stack serves (/openapi.json: api/openapi.yaml with the configured template
ids and reminder kinds and the zone database's names filled in), so every rejection of
a schema-valid request is a failure. scripts/fuzz_hooks.py leaves out the cases the
contract refuses in words where a schema cannot say it (each named there).

One check is left out, on purpose: `unsupported_method` wants 405 for a method a path
does not declare; API Gateway answers 404 for a route it does not have, and so does
the local stack (the contract says so).

Usage: .venv/bin/python scripts/fuzz.py target/debug/onegrant-local
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

MIN_CASES = 2000
MAX_EXAMPLES = "150"
SEED = "1"


def printed_port(printed, label):
    """The port onegrant-local printed for `label` (it binds port 0 to a free one)."""
    match = re.search(label + r"\s+http://127\.0\.0\.1:(\d+)", printed)
    if match is None:
        raise SystemExit(f"fuzz: the local stack printed no {label} address")
    return int(match.group(1))


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
        login = call("POST", f"http://127.0.0.1:{standin}/control/login-codes", {"user": "fuzz"})
        token = call("POST", f"{base}/v1/session", {"code": login["code"]})["token"]
        call("POST", f"{base}/v1/grants", {"request_id": "fuzz_1", "results": {"tmpl_water_reminder": "accept"}}, token)
        call("PUT", f"{base}/v1/reminders/water", {"enabled": True}, token)

        # The contract as this deployment serves it: the configured template ids and
        # reminder kinds and the zone database's names filled in.
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(call("GET", f"{base}/openapi.json"), f)
            schema_path = f.name
        tool = os.path.join(os.path.dirname(sys.executable), "schemathesis")
        command = [
            tool, "run", schema_path,
            "--url", base,
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
        stack.send_signal(signal.SIGTERM)
        try:
            stack.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stack.kill()


if __name__ == "__main__":
    main()
