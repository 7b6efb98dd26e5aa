"""Schemathesis hooks for scripts/fuzz.py: refusals the contract states in words where
JSON Schema cannot say them. Each is named here, and only that answer to that request
is let through; every other failure stands.

- PUT /v1/reminders/{kind}: a waking window whose two ends are equal is refused, 422
  invalid_waking_hours; JSON Schema cannot compare two fields (and a body giving one
  end alone is compared with the stored other end, which earlier cases set).
- POST /publisher/v1/notifications: a title with nothing visible once control and
  format characters are removed, or a send_at more than 30 days ahead, is refused, 422
  invalid_event (NotificationDetail says so); JSON Schema can say neither.
"""

import json

import schemathesis


def error_code(response):
    try:
        return json.loads(response.content or b"null")["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def error_message(response):
    try:
        return json.loads(response.content or b"null")["error"]["message"] or ""
    except (ValueError, KeyError, TypeError):
        return ""


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """False drops the failure: only the documented refusal of an equal waking window."""
    documented = (
        case.operation.method.upper() == "PUT"
        and case.operation.path == "/v1/reminders/{kind}"
        and response.status_code == 422
        and error_code(response) == "invalid_waking_hours"
        and isinstance(case.body, dict)
        and (
            case.body.get("wake_time") == case.body.get("sleep_time")
            or not isinstance(case.body.get("wake_time"), str)
            or not isinstance(case.body.get("sleep_time"), str)
        )
    )
    publisher_event = (
        case.operation.method.upper() == "POST"
        and case.operation.path == "/publisher/v1/notifications"
        and response.status_code == 422
        and error_code(response) == "invalid_event"
        and error_message(response).startswith(
            ("title has no visible characters", "send_at is more than")
        )
    )
    return not (documented or publisher_event)
