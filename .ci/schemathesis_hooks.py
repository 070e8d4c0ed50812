"""Schemathesis hooks of `.ci/schemathesis`: one check of our own, and one guard.

- `error_is_json_code_message`: every error answer (4xx, 5xx) is JSON `{code, message}` with a
  non-empty string `code` — also the answers to requests outside the document (unknown paths,
  unsupported methods, wrong media types), which the schema checks do not reach.
- `before_call`: the run must not revoke the admin token it authenticates with (the server keeps
  the last token, not a particular one), so `DELETE /tokens/{id}` never names it.
"""

import json
import os

import schemathesis

ADMIN_TOKEN_ID = os.environ.get("ORC_ADMIN_TOKEN_ID", "")
# Some other token id: the deletion then answers 404, as for any unknown id.
STAND_IN_ID = "00000000-0000-4000-8000-000000000000"


@schemathesis.check
def error_is_json_code_message(ctx, response, case):
    if response.status_code < 400:
        return None
    content_type = ",".join(response.headers.get("content-type", []))
    if not content_type.split(";")[0].strip().lower() == "application/json":
        raise AssertionError(
            f"{response.status_code} answered with Content-Type `{content_type or 'none'}`, not JSON: "
            f"{response.content[:200]!r}"
        )
    try:
        body = json.loads(response.content)
    except ValueError as e:
        raise AssertionError(f"{response.status_code} answered with a body that is not JSON ({e}): {response.content[:200]!r}")
    if not (
        isinstance(body, dict)
        and isinstance(body.get("code"), str)
        and body["code"]
        and isinstance(body.get("message"), str)
    ):
        raise AssertionError(f"{response.status_code} answered without `{{code, message}}`: {body!r}")
    return None


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if (
        ADMIN_TOKEN_ID
        and case.method.upper() == "DELETE"
        and case.path == "/tokens/{id}"
        and case.path_parameters
        and str(case.path_parameters.get("id", "")).lower() == ADMIN_TOKEN_ID.lower()
    ):
        case.path_parameters["id"] = STAND_IN_ID
