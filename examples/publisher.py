#!/usr/bin/env python3
"""A publisher's backend calling onegrant's publisher API with Python's standard library
alone: how to sign a request (docs/publishers.md), and, run as a script against the
local stack, a check of the API from outside Rust (local/tests/publisher_client.rs).

    python3 examples/publisher.py --api http://127.0.0.1:3000 --standin http://127.0.0.1:3002 \
        --invoke http://127.0.0.1:3001

The local stack serves the publisher com.example.shop with the key
local-publisher-secret unless ONEGRANT_PUBLISHERS says otherwise.
"""

import argparse
import hashlib
import hmac
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def signature(key, timestamp, method, target, body):
    """v1=<hex HMAC-SHA256 of "<timestamp>.<METHOD>.<path and query>.<raw body>">."""
    message = f"{timestamp}.{method}.{target}.".encode() + body
    return "v1=" + hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def call(api, source, key, method, target, payload=None, now=None):
    """One signed request to `target` (as sent: its path percent-encoded); (status,
    answer as JSON). The signature covers the path decoded and the query as sent."""
    body = b"" if payload is None else json.dumps(payload, ensure_ascii=False).encode()
    timestamp = str(int(now if now is not None else time.time()))
    path, _, query = target.partition("?")
    signed = urllib.parse.unquote(path) + ("?" + query if query else "")
    request = urllib.request.Request(api + target, data=body or None, method=method)
    request.add_header("content-type", "application/json")
    request.add_header("x-onegrant-publisher", source)
    request.add_header("x-onegrant-timestamp", timestamp)
    request.add_header("x-onegrant-signature", signature(key, timestamp, method, signed, body))
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"null")


def plain(method, url, payload=None, token=None):
    request = urllib.request.Request(
        url, data=None if payload is None else json.dumps(payload).encode(), method=method
    )
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def expect(what, got, want):
    if got != want:
        raise SystemExit(f"publisher.py: {what}: {got!r}, expected {want!r}")
    print(f"ok  {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--standin", required=True)
    parser.add_argument("--invoke", help="the local Invoke API: run the dispatcher's tick now")
    parser.add_argument("--source", default="com.example.shop")
    parser.add_argument("--key", default="local-publisher-secret")
    args = parser.parse_args()
    api, source, key = args.api.rstrip("/"), args.source, args.key

    # A user of the mini-program who accepted two order messages.
    login = plain("POST", f"{args.standin}/control/login-codes", {"user": "python"})
    openid = login["openid"]
    token = plain("POST", f"{api}/v1/session", {"code": login["code"]})["token"]
    plain("POST", f"{api}/v1/grants",
          {"request_id": "py_1", "results": {"tmpl_order_status": "accept"}}, token)
    # (What WeChat then holds for the user: the stand-in is told.)
    plain("POST", f"{args.standin}/control/quota",
          {"openid": openid, "template_id": "tmpl_order_status", "count": 1})

    order = {
        "idempotency_key": "order-1001:shipped", "openid": openid, "type": "order",
        "title": "订单已发货", "body": "订单 1001 已发货",
        "wechat": {"template_id": "tmpl_order_status",
                   "data": {"character_string1": "1001", "phrase2": "已发货", "thing3": "门店"}},
    }
    status, created = call(api, source, key, "POST", "/publisher/v1/notifications", order)
    expect("a signed publish is created", (status, created["status"]), (201, "created"))
    status, again = call(api, source, key, "POST", "/publisher/v1/notifications", order)
    expect("the same request again answers the same notification",
           (status, again["status"], again["note_id"]), (200, "duplicate", created["note_id"]))
    status, refused = call(api, source, "not-the-key-of-this-shop", "POST",
                           "/publisher/v1/notifications", dict(order, idempotency_key="x-1"))
    expect("a wrong key is refused", (status, refused["error"]["code"]), (401, "unsigned"))
    status, stale = call(api, source, key, "POST", "/publisher/v1/notifications",
                         dict(order, idempotency_key="x-2"), now=time.time() - 301)
    expect("a stale timestamp is refused", status, 401)

    # The key percent-encoded in the path (a client's encoder: ':' becomes %3A).
    target = f"/publisher/v1/notifications/{urllib.parse.quote('order-1001:shipped', safe='')}?openid={openid}"
    if args.invoke:
        # The tick EventBridge's schedule runs each minute, run now.
        with open("events/dispatcher-schedule.json", "rb") as event:
            urllib.request.urlopen(urllib.request.Request(
                f"{args.invoke}/2015-03-31/functions/DispatcherFunction/invocations",
                data=event.read(), method="POST"), timeout=60).read()
    deadline = time.monotonic() + 60
    while True:
        status, found = call(api, source, key, "GET", target)
        push = found["notification"]["push"]["status"] if status == 200 else None
        if push == "sent" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    expect("its status shows sent after the dispatcher's tick", (push, found.get("history") and
           [m["status"] for m in found["history"]]), ("sent", ["pending", "sent"]))

    later = dict(order, idempotency_key="order-1002:shipped",
                 send_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600)))
    status, scheduled = call(api, source, key, "POST", "/publisher/v1/notifications", later)
    expect("a scheduled one is created", (status, scheduled["status"]), (201, "created"))
    status, cancelled = call(api, source, key, "POST", "/publisher/v1/cancels",
                             {"openid": openid, "idempotency_key": "order-1002:shipped"})
    expect("a cancel over HTTP", (status, cancelled["status"]), (200, "cancelled"))
    print("publisher.py: ok")


if __name__ == "__main__":
    sys.exit(main())
