"""The schema registry client of the Spark job's driver: writer schemas by id, Confluent's REST API.

Records in Confluent's wire format name their writer schema by a global id; the driver asks the
registry of ``[spark.schema_registry]`` (:class:`mqd.config.SchemaRegistryConfig`) for each id it
meets once and keeps the answer for the client's life (a registered id never changes meaning).
Any registry that speaks Confluent's API fits: Confluent's own, Apicurio's ``/apis/ccompat/v7``,
Karapace, Redpanda.

- :meth:`SchemaRegistryClient.schema` (by id), :meth:`~SchemaRegistryClient.latest` (a subject's
  newest version), :meth:`~SchemaRegistryClient.versions` (a subject's version numbers).
- References (a Protobuf import, an Avro named type, a JSON Schema ``$ref`` held by another subject)
  are resolved: a :class:`RegisteredSchema` carries every schema it reaches through them, each once,
  dependencies before the schemas that use them, with the name it is referred to by.
- Several URLs (one registry behind several addresses): tried in turn, from the one that answered
  last, when one does not answer (connection refused, timeout, TLS failure, HTTP 5xx); an HTTP 4xx is
  the registry's answer and final.
- Basic auth (``username``/``password``) or ``bearer_token``; ``tls_ca_file`` for an https registry
  whose certificate the system store does not vouch for. Redirects are not followed (the
  credentials would go along).
- Failures raise :class:`SchemaRegistryError` naming the URL, the id or subject, the HTTP status and
  the registry's own message (Confluent's ``{"error_code": 40403, "message": ...}``).

Standard library HTTP (urllib): the driver asks once per id, not per record; no dependency added.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from mqd.config import SchemaRegistryConfig
from mqd.errors import MqdError

SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]
SCHEMA_TYPES: tuple[SchemaType, ...] = ("AVRO", "PROTOBUF", "JSON")
ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"
MAX_REFERENCE_DEPTH = 64  # a chain of references deeper than this is a cycle or a mistake
_BODY_LIMIT = 16 * 1024 * 1024  # one answer (a schema and its metadata); more is not a registry


class SchemaRegistryError(MqdError):
    """The registry could not give a schema: it answered an error (4xx: final), or none of its URLs
    answered (``retriable``). Carries what the message says: ``url``, ``schema_id`` or
    ``subject``, the HTTP ``status`` and the registry's ``error_code`` when there was an answer."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        schema_id: int | None = None,
        subject: str | None = None,
        status: int | None = None,
        error_code: int | None = None,
        retriable: bool = False,
    ) -> None:
        super().__init__(message, retriable=retriable)
        self.url = url
        self.schema_id = schema_id
        self.subject = subject
        self.status = status
        self.error_code = error_code


@dataclass(frozen=True)
class SchemaReference:
    """One reference as registered: the ``name`` the schema uses for it (a Protobuf import path, an
    Avro type's full name, a JSON Schema ``$ref``) and the ``subject`` and ``version`` that hold it."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class ResolvedReference:
    """A schema reached through references: how it was referred to, and what it is."""

    name: str
    subject: str
    version: int
    id: int
    schema_type: SchemaType
    schema: str
    references: tuple[SchemaReference, ...]  # its own, as registered


@dataclass(frozen=True)
class RegisteredSchema:
    """A registered schema: its global ``id``, type, text, its own ``references`` as registered, and
    ``referenced``: every schema reached through references, each once (by name), dependencies before
    the schemas that use them. ``subject`` and ``version`` are known when it was asked for by subject
    (:meth:`SchemaRegistryClient.latest`), None when by id (an id may be in several subjects)."""

    id: int
    schema_type: SchemaType
    schema: str
    references: tuple[SchemaReference, ...] = ()
    referenced: tuple[ResolvedReference, ...] = ()
    subject: str | None = None
    version: int | None = None

    @property
    def reference_texts(self) -> dict[str, str]:
        """Name -> schema text of every referenced schema (what a Protobuf compiler's import
        resolver or a JSON Schema ``$ref`` store is given)."""
        return {r.name: r.schema for r in self.referenced}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError: final, like a 4xx


@dataclass(frozen=True)
class _Answer:
    url: str
    status: int
    body: Any


class _NoAnswer(Exception):
    """One URL did not answer (or answered 5xx): the next is tried."""

    def __init__(self, reason: str, *, retriable: bool = True) -> None:
        super().__init__(reason)
        self.retriable = retriable


class SchemaRegistryClient:
    """Confluent's REST API of one registry (one or several URLs); safe to share between threads.

    Schemas by id and subject versions are kept for the client's life: each id and each referenced
    (subject, version) is asked for once. ``requests`` counts the HTTP requests sent (every URL tried
    counts)."""

    def __init__(self, config: SchemaRegistryConfig) -> None:
        self.config = config
        self.urls = [u.rstrip("/") for u in config.url]
        self.timeout = float(config.request_timeout)
        self.requests = 0
        self._first = 0  # the URL that answered last: asked first
        self._lock = threading.RLock()
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_version: dict[tuple[str, int], Mapping[str, Any]] = {}
        self._headers = {"Accept": ACCEPT, "User-Agent": "mqd-spark"}
        if config.username is not None and config.password is not None:
            pair = f"{config.username}:{config.password}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif config.bearer_token is not None:
            self._headers["Authorization"] = f"Bearer {config.bearer_token}"
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if any(u.startswith("https:") for u in self.urls):
            context = ssl.create_default_context(
                cafile=str(config.tls_ca_file) if config.tls_ca_file is not None else None
            )
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    # -- public ---------------------------------------------------------------------------------------

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema registered under the global id ``schema_id``, references resolved; asked for
        once per client."""
        schema_id = int(schema_id)
        with self._lock:
            cached = self._by_id.get(schema_id)
            if cached is not None:
                return cached
            what = f"schema id {schema_id}"
            body = self._get(f"/schemas/ids/{schema_id}", what, schema_id=schema_id)
            found = self._registered(body, what, schema_id=schema_id, known_id=schema_id)
            self._by_id[schema_id] = found
            return found

    def latest(self, subject: str) -> RegisteredSchema:
        """The newest version of ``subject`` (asked every time: a subject gains versions); its id
        is kept, so a later :meth:`schema` of it sends nothing."""
        what = f"subject {subject!r} latest version"
        with self._lock:
            body = self._get(f"/subjects/{_segment(subject)}/versions/latest", what, subject=subject)
            found = self._registered(body, what, subject=subject)
            self._by_id.setdefault(found.id, _by_id_view(found))
            return found

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """Version ``version`` of ``subject`` (kept: a registered version does not change)."""
        what = f"subject {subject!r} version {version}"
        with self._lock:
            body = self._subject_version(subject, int(version), what)
            found = self._registered(body, what, subject=subject)
            self._by_id.setdefault(found.id, _by_id_view(found))
            return found

    def versions(self, subject: str) -> list[int]:
        """The version numbers of ``subject``, oldest first (asked every time)."""
        what = f"subject {subject!r} versions"
        with self._lock:
            body = self._get(f"/subjects/{_segment(subject)}/versions", what, subject=subject)
        if not isinstance(body, list) or not all(isinstance(v, int) for v in body):
            raise self._bad_answer(
                what, f"expected a list of version numbers, got {_short(body)}", subject=subject
            )
        return sorted(cast(list[int], body))

    # -- answers into schemas --------------------------------------------------------------------------

    def _registered(
        self,
        body: Any,
        what: str,
        *,
        schema_id: int | None = None,
        subject: str | None = None,
        known_id: int | None = None,
    ) -> RegisteredSchema:
        fields = self._schema_fields(body, what, schema_id=schema_id, subject=subject)
        sid = known_id if known_id is not None else self._int(body, "id", what, schema_id, subject)
        refs = fields["references"]
        referenced = self._resolve(refs, what, schema_id=schema_id, subject=subject)
        version = self._int(body, "version", what, schema_id, subject) if subject is not None else None
        return RegisteredSchema(
            id=sid,
            schema_type=fields["schema_type"],
            schema=fields["schema"],
            references=refs,
            referenced=referenced,
            subject=body.get("subject", subject) if subject is not None else None,
            version=version,
        )

    def _schema_fields(
        self, body: Any, what: str, *, schema_id: int | None, subject: str | None
    ) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise self._bad_answer(
                what, f"no schema text in {_short(body)}", schema_id=schema_id, subject=subject
            )
        schema_type = body.get("schemaType") or "AVRO"  # Confluent leaves it out for Avro
        if schema_type not in SCHEMA_TYPES:
            raise self._bad_answer(
                what, f"unknown schemaType {schema_type!r} (expected one of {', '.join(SCHEMA_TYPES)})",
                schema_id=schema_id, subject=subject,
            )  # fmt: skip
        refs = []
        for ref in body.get("references") or ():
            try:
                refs.append(SchemaReference(str(ref["name"]), str(ref["subject"]), int(ref["version"])))
            except (KeyError, TypeError, ValueError):
                raise self._bad_answer(
                    what, f"a reference without name, subject and version: {_short(ref)}",
                    schema_id=schema_id, subject=subject,
                ) from None  # fmt: skip
        return {"schema": body["schema"], "schema_type": schema_type, "references": tuple(refs)}

    def _resolve(
        self, refs: tuple[SchemaReference, ...], what: str, *, schema_id: int | None, subject: str | None
    ) -> tuple[ResolvedReference, ...]:
        """Depth first, each name once, dependencies before their users; a cycle is an error."""
        done: dict[str, ResolvedReference] = {}
        path: list[str] = []

        def visit(ref: SchemaReference) -> None:
            if ref.name in done:
                return
            if ref.name in path or len(path) >= MAX_REFERENCE_DEPTH:
                chain = " -> ".join([*path, ref.name])
                raise SchemaRegistryError(
                    f"{what}: references form a cycle or a chain deeper than {MAX_REFERENCE_DEPTH}: {chain}",
                    schema_id=schema_id,
                    subject=subject,
                )
            path.append(ref.name)
            ref_what = f"{what}: reference {ref.name!r} (subject {ref.subject!r} version {ref.version})"
            body = self._subject_version(ref.subject, ref.version, ref_what, schema_id=schema_id)
            fields = self._schema_fields(body, ref_what, schema_id=schema_id, subject=ref.subject)
            for inner in fields["references"]:
                visit(inner)
            path.pop()
            done[ref.name] = ResolvedReference(
                name=ref.name,
                subject=ref.subject,
                version=self._int(body, "version", ref_what, schema_id, ref.subject),
                id=self._int(body, "id", ref_what, schema_id, ref.subject),
                schema_type=fields["schema_type"],
                schema=fields["schema"],
                references=fields["references"],
            )

        for ref in refs:
            visit(ref)
        return tuple(done.values())

    def _subject_version(
        self, subject: str, version: int, what: str, *, schema_id: int | None = None
    ) -> Mapping[str, Any]:
        key = (subject, version)
        cached = self._by_version.get(key)
        if cached is not None:
            return cached
        path = f"/subjects/{_segment(subject)}/versions/{version}"
        body = self._get(path, what, schema_id=schema_id, subject=subject)
        if not isinstance(body, dict):
            raise self._bad_answer(
                what, f"expected an object, got {_short(body)}", schema_id=schema_id, subject=subject
            )
        if version > 0:  # -1 is "latest": it moves
            self._by_version[key] = body
        return cast(Mapping[str, Any], body)

    def _int(
        self, body: Mapping[str, Any], key: str, what: str, schema_id: int | None, subject: str | None
    ) -> int:
        value = body.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad_answer(
                what, f"no integer {key!r} in {_short(body)}", schema_id=schema_id, subject=subject
            )
        return value

    def _bad_answer(
        self, what: str, problem: str, *, schema_id: int | None = None, subject: str | None = None
    ) -> SchemaRegistryError:
        url = self.urls[self._first]
        return SchemaRegistryError(
            f"schema registry {url}: {what}: unexpected answer: {problem}",
            url=url,
            schema_id=schema_id,
            subject=subject,
        )

    # -- HTTP -----------------------------------------------------------------------------------------

    def _get(self, path: str, what: str, *, schema_id: int | None = None, subject: str | None = None) -> Any:
        """GET ``path`` from the first URL that answers, starting at the one that answered last."""
        failures: list[str] = []
        retriable = True
        n = len(self.urls)
        for step in range(n):
            i = (self._first + step) % n
            base = self.urls[i]
            try:
                answer = self._send(base, path)
            except _NoAnswer as exc:
                failures.append(f"{base}: {exc}")
                retriable = retriable and exc.retriable
                continue
            if 200 <= answer.status < 300:
                self._first = i
                return answer.body
            code, message = _error_of(answer.body)
            self._first = i  # it answered: it is up
            raise SchemaRegistryError(
                f"schema registry {base}: {what}: HTTP {answer.status}"
                + (f", error {code}" if code is not None else "")
                + f": {message}",
                url=base,
                schema_id=schema_id,
                subject=subject,
                status=answer.status,
                error_code=code,
            )
        tried = "; ".join(failures)
        raise SchemaRegistryError(
            f"no schema registry URL answered for {what}: {tried}",
            url=self.urls[self._first] if n == 1 else None,
            schema_id=schema_id,
            subject=subject,
            retriable=retriable,
        )

    def _send(self, base: str, path: str) -> _Answer:
        """One GET; the answer (2xx, 3xx, 4xx) or _NoAnswer (no connection, timeout, TLS, 5xx)."""
        request = urllib.request.Request(base + path, headers=self._headers, method="GET")
        self.requests += 1
        try:
            with self._opener.open(request, timeout=self.timeout) as resp:
                status = int(resp.status)
                raw = resp.read(_BODY_LIMIT + 1)
        except urllib.error.HTTPError as exc:
            try:
                raw = exc.read(_BODY_LIMIT + 1) if exc.fp is not None else b""
            except OSError:
                raw = b""
            finally:
                exc.close()
            body = _json_or_text(raw)
            if exc.code >= 500:
                code, message = _error_of(body)
                raise _NoAnswer(
                    f"HTTP {exc.code}" + (f", error {code}" if code is not None else "") + f": {message}"
                ) from None
            return _Answer(base, exc.code, body)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                raise _NoAnswer(f"TLS: {reason}", retriable=False) from None
            raise _NoAnswer(str(reason)) from None
        except ssl.SSLError as exc:
            raise _NoAnswer(f"TLS: {exc}", retriable=False) from None
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise _NoAnswer(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        if len(raw) > _BODY_LIMIT:
            raise _NoAnswer(f"an answer over {_BODY_LIMIT} bytes", retriable=False)
        body = _json_or_text(raw)
        if isinstance(body, str):
            raise _NoAnswer(f"HTTP {status} but not JSON: {_short(body)}", retriable=False)
        return _Answer(base, status, body)


def _by_id_view(found: RegisteredSchema) -> RegisteredSchema:
    """What :meth:`SchemaRegistryClient.schema` returns for an id learnt through a subject."""
    return RegisteredSchema(found.id, found.schema_type, found.schema, found.references, found.referenced)


def _segment(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _error_of(body: Any) -> tuple[int | None, str]:
    """Confluent's error body ``{"error_code": 40403, "message": "..."}`` -> (code, message)."""
    if isinstance(body, dict):
        code = body.get("error_code")
        message = body.get("message")
        return (code if isinstance(code, int) else None), str(
            message if message is not None else _short(body)
        )
    return None, _short(body) or "(empty answer)"


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "RegisteredSchema",
    "ResolvedReference",
    "SchemaReference",
    "SchemaRegistryClient",
    "SchemaRegistryError",
    "SchemaType",
]
