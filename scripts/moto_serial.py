"""moto's server with every request applied one at a time.

Why: moto's threaded server is not atomic under concurrent requests (measured: 40 racing
conditional decrements of a counter at 10 gave 11-12 successes; two racing transactions
both won; HTTP 500 'dictionary changed size during iteration'). onegrant's guarantees
live in conditional writes and transactions, so the emulator must apply each request
atomically, as DynamoDB does. One process-wide lock around the WSGI app, with the whole
response body produced inside the lock, does that.

It also replaces one cost of moto's TransactWriteItems: moto deep-copies every table a
transaction touches, to roll back on cancellation (measured: 43 ms per transaction on a
1,000-item table, and ~0.66 KiB of memory per item per transaction, never released).
Because requests here are already one at a time, a snapshot of just the items the
transaction touches is an equivalent rollback; the suite proves a cancelled transaction
(Put, Update and Delete before a failing condition) still leaves nothing behind. And a
base-table Query reads only its partition instead of scanning the table, and an index
Query only the items on its index partition (see below).

And it refuses, as DynamoDB does and moto does not, a request whose
ExpressionAttributeNames or ExpressionAttributeValues hold a key no expression uses
(ValidationException), so such a bug fails the suite instead of production.

And it honours TransactWriteItems' ClientRequestToken, which moto ignores (it applies the
same transaction twice): a transaction that committed is remembered by its token for 10
minutes, and the same token again answers the first answer without applying anything;
the same token with other parameters is refused with IdempotentParameterMismatchException,
as DynamoDB does. A transaction that was cancelled is not remembered (nothing was
applied, so running it again is what a retry of it means).

And it keeps what the requests cost it, for benches: `GET /_onegrant/busy` answers the
process's CPU seconds so far, the seconds requests held the lock, and per operation
(`Query@index` for an index query) the requests and their seconds under the lock, and
`in_flight`: the requests taken in and not answered yet (a test that killed a client
waits for 0, so that client's last request has landed or been refused). The
emulator runs Python on one core at a time (the GIL), so its CPU seconds over a run's
wall time is how busy the run kept it.

Usage: python scripts/moto_serial.py [--host 127.0.0.1] [--port 0] [--exit-on-stdin-eof]
Prints one line "listening on <port>" once the socket accepts connections, then serves
until killed (SIGKILL is fine: all data is in memory).
"""

import argparse
import collections
import copy
import functools
import hashlib
import io
import json
import os
import re
import sys
import threading
import time

import moto.backends
import moto.core.responses
from moto.moto_server.threaded_moto_server import MotoRequestHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server
import moto.dynamodb.models as dynamodb_models
from moto.core.serialize import BaseJSONSerializer
from moto.dynamodb.models.table import Table


class _TableCopySkipper:
    """Stands in for the `copy` module inside moto's DynamoDB models while a transaction
    runs: tables are not copied (the per-item snapshot below replaces that backup);
    everything else is copied as usual."""

    active = False

    @staticmethod
    def deepcopy(value, memo=None):
        if _TableCopySkipper.active and isinstance(value, Table):
            return value
        return copy.deepcopy(value, memo)

    def __getattr__(self, name):
        return getattr(copy, name)


dynamodb_models.copy = _TableCopySkipper()
_moto_transact_write_items = dynamodb_models.DynamoDBBackend.transact_write_items


def _touched_keys(backend, transact_items):
    keys = []
    for entry in transact_items:
        for op_type, op in entry.items():
            table = backend.tables.get(op.get("TableName"))
            if table is None:
                continue
            if op_type == "Put":
                attrs = op.get("Item", {})
                key = {table.hash_key_attr: attrs.get(table.hash_key_attr)}
                if table.range_key_attr is not None:
                    key[table.range_key_attr] = attrs.get(table.range_key_attr)
            else:
                key = op.get("Key", {})
            if all(v is not None for v in key.values()):
                keys.append((op["TableName"], key))
    return keys


def transact_write_items(self, transact_items):
    """moto's TransactWriteItems with a per-item rollback instead of table copies."""
    snapshots = []
    for table_name, key in _touched_keys(self, transact_items):
        try:
            before = self.get_item(table_name, key)
        except Exception:  # a malformed key: moto itself will refuse the request
            continue
        snapshots.append((table_name, key, copy.deepcopy(before)))
    _TableCopySkipper.active = True
    try:
        return _moto_transact_write_items(self, transact_items)
    except Exception:
        for table_name, key, before in reversed(snapshots):
            if before is None:
                if self.get_item(table_name, key) is not None:
                    self.delete_item(table_name, key)
            else:
                self.put_item(table_name, before.to_json()["Attributes"])
        raise
    finally:
        _TableCopySkipper.active = False


dynamodb_models.DynamoDBBackend.transact_write_items = transact_write_items

# moto answers a base-table Query by scanning every item of the table for the partition
# key (moto/dynamodb/models/table.py, Table.query), so one user's query costs as much as
# the whole table. The items are already stored per partition: during such a query,
# let the scan see only that partition. An index query (string partition key) sees only
# the items on that index partition, found without moto's sort of the whole table
# (measured: 16 due-index queries on a 3,000-item table, 5.0 s → 0.48 s, same pages).
_moto_query = Table.query


def _index_matches(table, conditions):
    """The items whose attributes equal every (name, string value) of an index query's
    hash key, in no order."""
    partitions = table.items.values()
    items = (
        [item for partition in partitions for item in partition.values()]
        if table.range_key_attr
        else list(partitions)
    )

    def matches(item):
        for name, value in conditions:
            got = item.attrs.get(name)
            if got is None or got.type != "S" or got.value != value:
                return False
        return True

    return [item for item in items if matches(item)]


def _partition_query(self, hash_key, *args, **kwargs):
    index_name = kwargs.get("index_name", args[6] if len(args) > 6 else None)
    if index_name is not None:
        conditions = kwargs.get("hash_key_conditions") or []
        if not conditions or any(value.type != "S" for _, value in conditions):
            return _moto_query(self, hash_key, *args, **kwargs)
        # moto sorts the whole table before matching, then sorts the matches by the
        # index's keys and the table's (a total order), so the first sort is wasted:
        # hand it only the matches, unsorted.
        items = _index_matches(self, [(name, value.value) for name, value in conditions])
    elif hash_key is None or self.range_key_attr is None:
        return _moto_query(self, hash_key, *args, **kwargs)
    else:
        partition = self.items.get(hash_key)
        items = list(partition.values()) if partition else []
    self.all_items = lambda: items
    try:
        return _moto_query(self, hash_key, *args, **kwargs)
    finally:
        del self.all_items


Table.query = _partition_query


# moto answers through a serializer driven by botocore's service model, which walks
# every attribute value of every item member by member (moto/core/serialize.py): a Scan
# of 100 items cost 44 ms, 9 in 10 of it there (measured with cProfile). An attribute
# value that is already plain JSON (S, N, BOOL, NULL, SS, NS, L and M of those) comes
# out of that walk unchanged, so it is written as it is; any other (a binary, a value
# moto still holds as an object) goes through moto's own walk, as before. The suite's
# emulator test of every attribute type proves the answers the same.
_moto_serialize_structure = BaseJSONSerializer._serialize_type_structure
_SCALARS = {"S": str, "N": str, "BOOL": bool, "NULL": bool}


def _plain_attribute_value(value):
    """Whether `value` is an attribute value moto's walk would copy unchanged."""
    if type(value) is not dict or len(value) != 1:
        return False
    ((kind, inner),) = value.items()
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        return type(inner) is scalar
    if kind in ("SS", "NS"):
        return type(inner) is list and all(type(e) is str for e in inner)
    if kind == "L":
        return type(inner) is list and all(_plain_attribute_value(e) for e in inner)
    if kind == "M":
        return type(inner) is dict and all(
            type(name) is str and _plain_attribute_value(e) for name, e in inner.items()
        )
    return False


def _serialize_structure(self, serialized, value, shape, key):
    if key and shape.name == "AttributeValue" and _plain_attribute_value(value):
        self._default_serialize(serialized, value, shape, key)
        return
    _moto_serialize_structure(self, serialized, value, shape, key)


if os.environ.get("ONEGRANT_EMULATOR_MOTO_SERIALIZER") != "1":
    BaseJSONSerializer._serialize_type_structure = _serialize_structure


# Two things moto's server works out again on every request, each the same every
# time: which services it has (moto/backends.py lists its own package folder: a listdir
# and 300 stats per request) and which methods a response class has (inspect.getmembers
# of the class). Together a tenth of the emulator's time (measured with cProfile over
# the inbox tests); worked out once here.
_moto_modules = tuple(moto.backends.list_of_moto_modules())
moto.backends.list_of_moto_modules = lambda: _moto_modules
_moto_method_names = moto.core.responses.method_names_from_class
moto.core.responses.method_names_from_class = functools.lru_cache(maxsize=None)(
    lambda clazz: tuple(_moto_method_names(clazz))
)


_PLACEHOLDER = re.compile(r"[#:][A-Za-z0-9_]+")
_EXPRESSIONS = (
    "KeyConditionExpression",
    "FilterExpression",
    "UpdateExpression",
    "ConditionExpression",
    "ProjectionExpression",
)


def _unused_placeholders(request):
    """DynamoDB refuses a request whose ExpressionAttributeNames or Values hold a key no
    expression uses (ValidationException); moto accepts it. The message DynamoDB gives,
    or None."""
    used = set()
    for field in _EXPRESSIONS:
        used.update(_PLACEHOLDER.findall(request.get(field) or ""))
    for kind in ("Values", "Names"):
        unused = sorted(set(request.get(f"ExpressionAttribute{kind}") or {}) - used)
        if unused:
            keys = ", ".join(unused)
            return (
                f"Value provided in ExpressionAttribute{kind} unused in expressions: "
                f"keys: {{{keys}}}"
            )
    return None


def _validation_error(environ, start_response):
    """The checks DynamoDB makes that moto does not: the error, or None to go on."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if not target.startswith("DynamoDB_"):
        return None
    request = _read_request(environ)
    if not isinstance(request, dict):
        return None
    operation = target.split(".", 1)[-1]
    if operation == "TransactWriteItems":
        parts = [
            part
            for item in request.get("TransactItems", [])
            for part in item.values()
            if isinstance(part, dict)
        ]
    else:
        parts = [request]
    for part in parts:
        message = _unused_placeholders(part)
        if message:
            return _error(start_response, "ValidationException", message)
    return None


def _error(start_response, kind, message):
    """A DynamoDB error answer (400) of `kind`."""
    payload = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{kind}", "message": message}
    ).encode()
    start_response(
        "400 Bad Request",
        [
            ("Content-Type", "application/x-amz-json-1.0"),
            ("Content-Length", str(len(payload))),
        ],
    )
    return [payload]


def _operation(environ):
    """The request's operation, `Query@index` for a query of an index (what `/_onegrant/busy`
    counts it as)."""
    operation = environ.get("HTTP_X_AMZ_TARGET", "").split(".", 1)[-1] or "other"
    if operation == "Query":
        request = _read_request(environ)
        if isinstance(request, dict) and request.get("IndexName"):
            return "Query@index"
    return operation


def _read_request(environ):
    """The request's JSON body (None if it is not JSON), left readable for the app."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    try:
        return json.loads(body or b"{}")
    except ValueError:
        return None


# DynamoDB remembers a committed token for 10 minutes; a test of the window's end sets a
# shorter one.
TOKEN_WINDOW_SECONDS = float(os.environ.get("ONEGRANT_EMULATOR_TOKEN_WINDOW_SECONDS", "600"))


def _transaction_token(environ):
    """(token, the request without it) of a TransactWriteItems carrying a
    ClientRequestToken, else None. The body is left readable for the app."""
    if environ.get("HTTP_X_AMZ_TARGET", "") != "DynamoDB_20120810.TransactWriteItems":
        return None
    request = _read_request(environ)
    if not isinstance(request, dict):
        return None
    token = request.pop("ClientRequestToken", None)
    if not token:
        return None
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    return token, digest




class SerialApp:
    """A WSGI app that runs the wrapped app under a lock, body included, and answers
    a committed transaction's token replays (see the module docs)."""

    def __init__(self, app):
        self._app = app
        self._lock = threading.Lock()
        # token -> (request digest, committed at, status, headers, body), oldest first
        self._tokens = collections.OrderedDict()
        # operation -> [requests, seconds under the lock]; written under the lock
        self._busy = collections.defaultdict(lambda: [0, 0.0])
        # Requests taken in and not yet answered (waiting for the lock or under it): a
        # test that killed a client reads it to know that client's last request landed.
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()

    def _busy_answer(self, start_response):
        with self._lock:
            operations = {op: {"requests": n, "seconds": t} for op, (n, t) in self._busy.items()}
        payload = json.dumps(
            {
                "cpu_seconds": time.process_time(),
                "locked_seconds": sum(op["seconds"] for op in operations.values()),
                "in_flight": self._in_flight,
                "operations": operations,
            }
        ).encode()
        start_response(
            "200 OK",
            [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))],
        )
        return [payload]

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == "/_onegrant/busy":
            return self._busy_answer(start_response)
        refused = _validation_error(environ, start_response)
        if refused is not None:
            return refused
        with self._in_flight_lock:
            self._in_flight += 1
        try:
            tokened = _transaction_token(environ)
            operation = _operation(environ)
            with self._lock:
                started = time.perf_counter()
                try:
                    return self._serve(environ, start_response, tokened)
                finally:
                    busy = self._busy[operation]
                    busy[0] += 1
                    busy[1] += time.perf_counter() - started
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    def _serve(self, environ, start_response, tokened):
        """One request, under the lock."""
        now = time.monotonic()
        if tokened is not None:
            while self._tokens:
                oldest = next(iter(self._tokens.values()))
                if now - oldest[1] < TOKEN_WINDOW_SECONDS:
                    break
                self._tokens.popitem(last=False)
            token, request = tokened
            seen = self._tokens.get(token)
            if seen is not None:
                if seen[0] != request:
                    return _error(
                        start_response,
                        "IdempotentParameterMismatchException",
                        "The request uses the same client token as a previous, "
                        "but non-identical request.",
                    )
                start_response(seen[2], seen[3])
                return [seen[4]]
        answered = {}

        def capture(status, headers, exc_info=None):
            answered["status"], answered["headers"] = status, list(headers)
            return start_response(status, headers, exc_info)

        result = self._app(environ, capture)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if tokened is not None and answered.get("status", "").startswith("200"):
            self._tokens[tokened[0]] = (
                tokened[1],
                now,
                answered["status"],
                answered["headers"],
                body,
            )
        return [body]


class QuietHandler(MotoRequestHandler):
    def log_request(self, *args, **kwargs):  # noqa: D401 - werkzeug hook
        pass


def main():
    # How often threads switch. Under Python's default 5 ms a moto request rarely loses
    # the GIL midway, so an unserialised server *looks* atomic on an idle machine
    # (measured: 10/10 clean rounds) and races only under load (the reference
    # measurement saw 11-12 successes out of 10). The suite's atomicity tests run an
    # emulator switching every microsecond (ONEGRANT_EMULATOR_SWITCH_INTERVAL=1e-6),
    # where the same unlocked server fails in the first round, so they prove the lock
    # below is what makes the emulator atomic, not luck. Every other emulator keeps the
    # default: switching every microsecond cost a tenth of the emulator's time.
    interval = os.environ.get("ONEGRANT_EMULATOR_SWITCH_INTERVAL")
    if interval:
        sys.setswitchinterval(float(interval))
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="exit when standard input closes, i.e. when the parent process dies",
    )
    args = parser.parse_args()

    if args.exit_on_stdin_eof:
        def watch_parent():
            sys.stdin.read()
            os._exit(0)

        threading.Thread(target=watch_parent, daemon=True).start()

    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(
        args.host,
        args.port,
        SerialApp(app),
        threaded=True,
        request_handler=QuietHandler,
    )
    print(f"listening on {server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
