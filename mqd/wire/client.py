"""Async HTTP client for one broker cluster: the only code that speaks the wire to brokers.

Used by the producer, the consumer, the tools and the tests. It knows URLs, not policy: routing,
retries and backoff belong to the caller. Errors carry ``retriable`` so callers can decide.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from mqd.errors import MqdError
from mqd.wire.http_connections import Answer, AnswerError, FetchBody, HttpConnections
from mqd.wire.protocol import BATCH_CONTENT_TYPE, FETCH_CONTENT_TYPE, FetchAnswer, decode_fetch_answer

__all__ = ["BrokerClient", "BrokerError", "FetchBody", "ProduceResult", "tls_context"]


class BrokerError(MqdError):
    """An error answer or a transport failure talking to a broker node."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        body: dict[str, Any] | None = None,
        retriable: bool = True,
    ) -> None:
        super().__init__(message, retriable=retriable)
        self.status = status
        self.code = code
        self.body = body or {}


def error_answer(method: str, url: str, status: int, payload: bytes | bytearray) -> BrokerError:
    """The BrokerError of an error answer (status >= 400): the broker's JSON error and reason."""
    try:
        err = json.loads(payload)
    except ValueError:
        err = {"reason": bytes(payload[:200]).decode(errors="replace")}
    if not isinstance(err, dict):
        err = {"reason": str(err)}
    return BrokerError(
        f"{method} {url}: {status} {err.get('error', '')}: {err.get('reason', '')}",
        status=status,
        code=err.get("error"),
        body=err,
        retriable=status >= 500 or status in (408, 421, 429),
    )


@dataclass(frozen=True, slots=True)
class ProduceResult:
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    count: int
    max_offset: int


def tls_context(ca_file: str | Path) -> ssl.SSLContext:
    """A client TLS context that trusts the CA bundle ``ca_file`` (PEM), hostname checked as usual.

    Raises BrokerError (not retriable) when the file cannot be read or holds no certificate.
    """
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise BrokerError(f"cannot load CA file {ca_file}: {exc}", retriable=False) from exc


class BrokerClient:
    """One set of kept-alive connections (mqd.wire.http_connections) shared by all requests to all
    nodes of a cluster.

    ``ca_file``: PEM bundle used to verify the brokers' certificates on https URLs (default: the
    system store, which ``SSL_CERT_FILE`` can also point elsewhere).
    """

    def __init__(
        self,
        *,
        request_timeout: float = 30.0,
        auth_token: str | None = None,
        limit_per_host: int = 8,
        ca_file: str | Path | None = None,
    ) -> None:
        self._timeout = request_timeout
        self._headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._limit_per_host = limit_per_host
        # built here so a bad CA file fails at construction, not at the first https request
        self._ssl: ssl.SSLContext | bool = tls_context(ca_file) if ca_file is not None else True
        self._http: HttpConnections | None = None

    async def start(self) -> None:
        if self._http is None:
            self._http = HttpConnections(
                headers=self._headers, ssl_context=self._ssl, limit_per_host=self._limit_per_host
            )

    async def close(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    async def __aenter__(self) -> BrokerClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- transport -----------------------------------------------------------------------------

    async def _answer(
        self,
        method: str,
        url: str,
        body: bytes | None,
        timeout: float,
        *,
        content_type: str = "application/json",
        idempotent: bool = True,
    ) -> Answer:
        """One exchange: a transport failure or an error answer (4xx, 5xx) is a BrokerError."""
        if self._http is None:
            raise RuntimeError("BrokerClient.start() was not called")
        try:
            answer = await self._http.request(
                method, url, body, timeout, content_type=content_type, idempotent=idempotent
            )
        except (OSError, TimeoutError, AnswerError) as exc:
            raise BrokerError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if answer.status >= 400:
            raise error_answer(method, url, answer.status, answer.body)
        return answer

    async def _request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> Any:
        body = (
            data if data is not None else (json.dumps(json_body).encode() if json_body is not None else None)
        )
        answer = await self._answer(
            method, url, body, timeout or self._timeout, content_type=content_type, idempotent=idempotent
        )
        try:
            return json.loads(answer.body) if answer.body else None
        except ValueError as exc:  # a damaged 2xx answer: the next try may be fine
            raise BrokerError(
                f"{method} {url}: malformed answer: {exc}", status=answer.status, retriable=True
            ) from exc

    # -- endpoints -----------------------------------------------------------------------------

    async def health(self, url: str, timeout: float = 2.0) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request("GET", f"{url}/v1/health", timeout=timeout)
        return answer

    async def metadata(self, url: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request("GET", f"{url}/v1/metadata")
        return answer

    async def stats(self, url: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request("GET", f"{url}/v1/stats")
        return answer

    async def produce(
        self, url: str, topic: str, partition: int, batches: bytes, acks: str = "master"
    ) -> ProduceResult:
        r = await self._request(
            "POST",
            f"{url}/v1/produce/{topic}/{partition}?acks={acks}",
            data=batches,
            content_type=BATCH_CONTENT_TYPE,
            idempotent=False,  # a produce sent again on a new connection could append twice
        )
        return ProduceResult(
            r["topic"], r["partition"], r["base_offset"], r["last_offset"], r["count"], r["max_offset"]
        )

    async def fetch(
        self,
        url: str,
        partitions: list[dict[str, Any]] | bytes,
        *,
        client_id: str = "",
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 32 * 1024 * 1024,
        changes_only: bool = False,
    ) -> FetchAnswer:
        """One request for many partitions: ``[{"topic", "partition", "offset", "max_bytes"}]``, or
        that list already encoded as JSON (a caller that sends the same partitions again keeps it).
        ``changes_only``: the answer leaves out partitions with nothing new (docs/protocol.md)."""
        body: dict[str, Any] = {
            "client_id": client_id,
            "max_wait_ms": max_wait_ms,
            "min_bytes": min_bytes,
            "max_bytes": max_bytes,
        }
        if changes_only:
            body["changes_only"] = True
        if isinstance(partitions, bytes):  # the partition list already encoded (an idle round's again)
            data = json.dumps(body).encode()[:-1] + b', "partitions": ' + partitions + b"}"
        else:
            data = json.dumps({**body, "partitions": partitions}).encode()
        where = url + "/v1/fetch"
        # the answer's body lands in its own buffer straight from the socket (http_connections)
        answer = await self._answer("POST", where, data, self._timeout + max_wait_ms / 1000)
        if answer.headers.get("content-type", "").split(";")[0] != FETCH_CONTENT_TYPE:
            raise BrokerError(f"POST {where}: unexpected content type", status=answer.status)
        # the body (a bytearray) is read like bytes, and kept: the batches are views of it
        return decode_fetch_answer(cast(bytes, answer.body))

    async def list_offsets(self, url: str, partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        r = await self._request("POST", f"{url}/v1/offsets", json_body={"partitions": partitions})
        return list(r["partitions"])

    async def heartbeat(
        self, url: str, group: str, client_id: str, topics: list[str], session_timeout_ms: int
    ) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request(
            "POST",
            f"{url}/v1/groups/{group}/heartbeat",
            json_body={
                "client_id": client_id,
                "topics": topics,
                "session_timeout_ms": session_timeout_ms,
            },
        )
        return answer

    async def leave(self, url: str, group: str, client_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request(
            "POST", f"{url}/v1/groups/{group}/leave", json_body={"client_id": client_id}
        )
        return answer

    async def commit(
        self,
        url: str,
        group: str,
        client_id: str,
        offsets: list[dict[str, Any]],
        force: bool = False,
    ) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request(
            "POST",
            f"{url}/v1/groups/{group}/commit",
            json_body={"client_id": client_id, "offsets": offsets, "force": force},
        )
        return answer

    async def committed(
        self, url: str, group: str, partitions: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        r = await self._request(
            "POST", f"{url}/v1/groups/{group}/offsets", json_body={"partitions": partitions or []}
        )
        return list(r["offsets"])
