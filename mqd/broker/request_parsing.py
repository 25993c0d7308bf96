"""Checking a request of the broker's HTTP API, and the error answer it gets when it is wrong.

Every bad input becomes an :class:`ApiError`, answered as JSON ``{"error": code, "reason": ...}``
with an HTTP status by the API's error middleware; the validators name the offending field
(``partitions[3].offset: must be an integer``) so a client can tell what to fix. Bodies are read
with a deadline (:func:`read_body`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, NoReturn

from aiohttp import web

from mqd import record_size
from mqd.errors import MqdError
from mqd.wire import format as fmt

MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1
_MISSING: Any = object()


class ApiError(MqdError):
    """An error answer: JSON ``{"error": code, "reason": ..., **extra}`` with an HTTP status, extra
    ``headers``, and ``close`` to drop the connection after it (its request body was not read)."""

    def __init__(
        self,
        status: int,
        code: str,
        reason: str,
        *,
        headers: Mapping[str, str] | None = None,
        close: bool = False,
        **extra: Any,
    ) -> None:
        super().__init__(reason, retriable=status >= 500 or status in (408, 421, 429))
        self.status = status
        self.code = code
        self.reason = reason
        self.headers = dict(headers or {})
        self.close = close
        self.extra = extra

    def response(self) -> web.Response:
        body = {"error": self.code, "reason": self.reason, **self.extra}
        resp = web.json_response(body, status=self.status, headers=self.headers)
        if self.close:
            resp.force_close()
        return resp


def bad(reason: str) -> NoReturn:
    """Answer 400 bad_request with ``reason``."""
    raise ApiError(400, "bad_request", reason)


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The request's whole body; 408 (and the connection closed) when it has not all arrived
    ``timeout_s`` seconds after the call: a sender stalling mid-body would hold a socket forever.
    A declared ``Content-Length`` over the app's ``client_max_size`` is 413 at once, unread (else
    the node would wait the whole timeout for bytes it would refuse anyway)."""
    limit = request.client_max_size
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "too_large", f"request body larger than {limit} bytes", close=True)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise ApiError(
            408, "body_timeout", f"request body not received within {timeout_s:g}s", close=True
        ) from None


# the content types a web page may POST to another origin without a CORS preflight
_BROWSER_SIMPLE_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})


def check_json_content_type(request: web.Request) -> None:
    """415 ``bad_content_type`` for the bodies a foreign web page can make a browser POST to a broker
    without a CORS preflight: a form, ``text/plain`` (which can carry JSON), or an untyped Blob
    (recognised by the browser's ``Origin`` / ``Sec-Fetch-Site``). With no broker token those would
    commit offsets or evict group members. Any other type needs a preflight, which the broker never
    grants, so programs sending ``application/json``, octet-stream or no type are served as before."""
    declared = request.headers.get("Content-Type")
    if declared is None:
        if "Origin" in request.headers or "Sec-Fetch-Site" in request.headers:
            raise ApiError(
                415, "bad_content_type", "a browser request must declare Content-Type: application/json"
            )
        return
    mime = declared.split(";", 1)[0].strip().lower()
    if mime in _BROWSER_SIMPLE_TYPES:
        raise ApiError(415, "bad_content_type", f"expected application/json, got {mime}")


async def json_body(request: web.Request, timeout_s: float) -> dict[str, Any]:
    """The request's body (read within ``timeout_s``, see :func:`read_body`), a JSON object
    declared as such (:func:`check_json_content_type`)."""
    check_json_content_type(request)
    raw = await read_body(request, timeout_s)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        bad("body is not valid JSON")
    if not isinstance(data, dict):
        bad("body must be a JSON object")
    return data


def check_record_sizes(body: bytes, infos: list[fmt.BatchInfo], limit: int) -> None:
    """413 ``record_too_large`` when a record of the validated produce ``body`` is larger than
    ``limit`` (limits.max_record_bytes; mqd/record_size.py says why there is one limit)."""
    try:
        fmt.check_record_sizes(body, infos, limit)
    except record_size.RecordTooLarge as exc:
        raise ApiError(413, "record_too_large", str(exc), size=exc.size, limit=exc.limit) from None


def int_field(
    obj: dict[str, Any],
    key: str,
    where: str = "",
    *,
    default: Any = _MISSING,
    minimum: int = 0,
    maximum: int = MAX_OFFSET,
) -> int:
    value = obj.get(key, default)
    if value is _MISSING:
        bad(f"{where}{key}: required")
    if isinstance(value, bool) or not isinstance(value, int):
        bad(f"{where}{key}: must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        bad(f"{where}{key}: must be in [{minimum}, {maximum}], got {value}")
    return value


def str_field(
    obj: dict[str, Any], key: str, where: str = "", *, default: Any = _MISSING, empty: bool = False
) -> str:
    value = obj.get(key, default)
    if value is _MISSING:
        bad(f"{where}{key}: required")
    if not isinstance(value, str):
        bad(f"{where}{key}: must be a string, got {type(value).__name__}")
    if not empty and not value:
        bad(f"{where}{key}: must not be empty")
    if len(value) > 1024:
        bad(f"{where}{key}: longer than 1024 characters")
    return value


def list_field(obj: dict[str, Any], key: str, *, default: Any = _MISSING, limit: int = 100_000) -> list[Any]:
    value = obj.get(key, default)
    if value is _MISSING:
        bad(f"{key}: required")
    if not isinstance(value, list):
        bad(f"{key}: must be a list, got {type(value).__name__}")
    if len(value) > limit:
        bad(f"{key}: more than {limit} entries")
    return value


def obj_value(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        bad(f"{where}: must be an object, got {type(value).__name__}")
    return value
