"""Replica identity: which node of a broker group is speaking, proved with per-node secrets.

Client tokens say nothing about who is a replica (issue 13.1): every producer holds the same token.
So a replica call (``/v1/replica/*``) carries the caller's node id, the cluster id, a nonce (wall
clock ms + 16 random bytes) and an HMAC-SHA256, keyed with the *caller's* own secret, over the
method, path, nonce and body digest. A secret never goes on the wire. The answer (200) carries the
answering node's HMAC, keyed with *its* secret, over the caller's nonce, the status and the answer
digest: a slave only applies data from a node that knows its master's secret (issue 13.2), and an
old answer replayed to a new request fails (the nonce differs).

Each node's credentials file (TOML, mode 0600, written by ``mqd broker-credentials``) holds the
cluster id, its node id, its own secret and the secrets of the peers it must verify: a master those
of its slaves, a slave its master's. A slave does not know another slave's secret, so it can only
report its own progress. Requests older or newer than :data:`REPLAY_WINDOW_S`, or whose nonce was
already seen inside the window, are refused. Comparisons are constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import time
import tomllib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mqd.config import BrokerGroupSpec, ClusterConfig, ConfigError
from mqd.errors import MqdError

REPLAY_WINDOW_S = 60.0  # a signed request is accepted within this many seconds of its nonce's clock
SECRET_BYTES = 32
HEADER_NODE = "X-Mqd-Replica-Node"
HEADER_CLUSTER = "X-Mqd-Replica-Cluster"
HEADER_NONCE = "X-Mqd-Replica-Nonce"
HEADER_SIGNATURE = "X-Mqd-Replica-Signature"
_REQUEST_DOMAIN = b"mqd-replica-request-v1"
_ANSWER_DOMAIN = b"mqd-replica-answer-v1"


class ReplicaAuthError(MqdError):
    """A replica request or answer that does not prove who sent it. Not retriable as such: the
    caller is not who it claims (or its credentials differ from ours)."""

    def __init__(self, message: str, *, status: int = 401) -> None:
        super().__init__(message, retriable=False)
        self.status = status


@dataclass(frozen=True, slots=True)
class ReplicaCredentials:
    """One node's credentials file: the cluster id, its node id, node id -> secret (hex)."""

    cluster_id: str
    node_id: str
    secrets: Mapping[str, str]


def peers_of(group: BrokerGroupSpec, node_id: str) -> list[str]:
    """The nodes ``node_id`` exchanges replica calls with: a master its slaves, a slave its master."""
    if group.master.id == node_id:
        return [n.id for n in group.slaves]
    return [group.master.id]


# -- credentials files ------------------------------------------------------------------------------


def _file_text(creds: ReplicaCredentials) -> str:
    lines = [
        f"# mqd replica credentials of node {creds.node_id}: secret, keep it mode 0600 on that node only",
        f"cluster_id = {json.dumps(creds.cluster_id)}",
        f"node_id = {json.dumps(creds.node_id)}",
        "",
        "[secrets]",
    ]
    lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in creds.secrets.items()]
    return "\n".join(lines) + "\n"


def credentials_file_name(node_id: str) -> str:
    return f"{node_id}.credentials.toml"


def generate_credentials(
    cluster: ClusterConfig,
    out_dir: Path,
    *,
    cluster_id: str | None = None,
    nodes: Iterable[str] | None = None,
    lone_masters: bool = False,
) -> dict[str, Path]:
    """Write one credentials file (mode 0600) per node of every group with more than one node into
    ``out_dir``: a fresh secret per node, shared only with the peers that verify it. Returns node id
    -> file. ``nodes`` limits which files are written (every node still gets a new secret);
    ``lone_masters`` writes one for masters without slaves too (a uniform install: systemd's
    LoadCredential= needs a file for every node)."""
    cid = cluster_id or uuid.uuid4().hex
    wanted = set(nodes) if nodes is not None else None
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for group in cluster.groups:
        if len(group.nodes) < 2 and not lone_masters:
            continue  # a lone master has no replica calls to prove
        node_secrets = {n.id: secrets.token_hex(SECRET_BYTES) for n in group.nodes}
        for n in group.nodes:
            if wanted is not None and n.id not in wanted:
                continue
            own = {n.id: node_secrets[n.id]}
            own.update({p: node_secrets[p] for p in peers_of(group, n.id)})
            path = out_dir / credentials_file_name(n.id)
            # O_EXCL on a temp name with mode 0600 from the start: the secret is never readable by others
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, _file_text(ReplicaCredentials(cid, n.id, own)).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            written[n.id] = path
    return written


def load_credentials(path: Path, node_id: str, peers: Sequence[str]) -> ReplicaCredentials:
    """Read and check ``node_id``'s credentials file: private (no group/other permission bits), its
    own node id, a cluster id, and a secret for itself and each of ``peers``. ConfigError otherwise."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{path}: replica credentials not readable: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path}: replica credentials are readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"chmod 600 it"
        )
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not a replica credentials file: {exc}") from None
    cluster_id, file_node, raw = data.get("cluster_id"), data.get("node_id"), data.get("secrets")
    if not isinstance(cluster_id, str) or not cluster_id:
        raise ConfigError(f"{path}: cluster_id: required (a string)")
    if file_node != node_id:
        raise ConfigError(f"{path}: node_id: the file is for node {file_node!r}, this node is {node_id!r}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: secrets: required (a table of node id = hex secret)")
    for who in [node_id, *peers]:
        value = raw.get(who)
        if not isinstance(value, str):
            raise ConfigError(f"{path}: secrets: no secret for node {who!r}")
        try:
            key = bytes.fromhex(value)
        except ValueError:
            raise ConfigError(f"{path}: secrets.{who}: not a hex string") from None
        if len(key) < 16:
            raise ConfigError(f"{path}: secrets.{who}: shorter than 16 bytes")
    return ReplicaCredentials(cluster_id, node_id, {k: v for k, v in raw.items() if isinstance(v, str)})


# -- signing and checking ---------------------------------------------------------------------------


def body_digest(parts: Iterable[bytes | bytearray | memoryview]) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.digest()


def _mac(key: bytes, *fields: bytes) -> str:
    return hmac.new(key, b"\n".join(fields), hashlib.sha256).hexdigest()


class _NonceCache:
    """Nonces of accepted requests within the replay window (only authenticated ones enter it)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._pruned_at = 0.0

    def first_use(self, nonce: str, now: float) -> bool:
        if now - self._pruned_at > REPLAY_WINDOW_S:
            horizon = now - 2 * REPLAY_WINDOW_S
            self._seen = {n: t for n, t in self._seen.items() if t >= horizon}
            self._pruned_at = now
        if nonce in self._seen:
            return False
        self._seen[nonce] = now
        return True


class ReplicaAuth:
    """Signs this node's replica requests and answers and checks its peers'."""

    def __init__(self, creds: ReplicaCredentials, peers: Sequence[str]) -> None:
        self.node_id = creds.node_id
        self.cluster_id = creds.cluster_id
        self.peers = frozenset(peers)
        self._keys = {who: bytes.fromhex(creds.secrets[who]) for who in [creds.node_id, *peers]}
        self._nonces = _NonceCache()

    def new_nonce(self) -> str:
        return f"{int(time.time() * 1000)}-{secrets.token_hex(16)}"

    def sign_request(self, method: str, path: str, body: bytes, nonce: str) -> dict[str, str]:
        """Headers proving this node sent ``method path`` with ``body``."""
        sig = _mac(
            self._keys[self.node_id],
            _REQUEST_DOMAIN,
            self.cluster_id.encode(),
            self.node_id.encode(),
            method.upper().encode(),
            path.encode(),
            nonce.encode(),
            body_digest([body]),
        )
        return {
            HEADER_NODE: self.node_id,
            HEADER_CLUSTER: self.cluster_id,
            HEADER_NONCE: nonce,
            HEADER_SIGNATURE: sig,
        }

    def verify_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> str:
        """The peer that signed this request; ReplicaAuthError (401, or 403 for a node that is not
        one of this node's replica peers) otherwise."""
        node, cluster = headers.get(HEADER_NODE), headers.get(HEADER_CLUSTER)
        nonce, sig = headers.get(HEADER_NONCE), headers.get(HEADER_SIGNATURE)
        if not node or not cluster or not nonce or not sig:
            raise ReplicaAuthError("replica calls need a node signature (X-Mqd-Replica-* headers)")
        _check_ascii(node, cluster, nonce, sig)
        if not hmac.compare_digest(cluster.encode(), self.cluster_id.encode()):
            raise ReplicaAuthError("replica call from another cluster (cluster id differs)", status=403)
        key = self._keys.get(node) if node in self.peers else None
        if key is None:
            raise ReplicaAuthError(f"node {node!r} is not a replica peer of {self.node_id}", status=403)
        expected = _mac(
            key,
            _REQUEST_DOMAIN,
            cluster.encode(),
            node.encode(),
            method.upper().encode(),
            path.encode(),
            nonce.encode(),
            body_digest([body]),
        )
        if not hmac.compare_digest(expected.encode(), sig.encode()):
            raise ReplicaAuthError(f"bad replica signature for node {node!r}")
        now = time.time()
        try:
            sent_ms = int(nonce.split("-", 1)[0])
        except ValueError:
            raise ReplicaAuthError("malformed replica nonce") from None
        if abs(now - sent_ms / 1000) > REPLAY_WINDOW_S:
            raise ReplicaAuthError(
                f"replica call from {node!r} outside the {REPLAY_WINDOW_S:g}s window (clocks differ?)"
            )
        if not self._nonces.first_use(nonce, now):
            raise ReplicaAuthError(f"replayed replica call from {node!r}")
        return node

    def sign_answer(
        self, nonce: str, status: int, parts: Iterable[bytes | bytearray | memoryview]
    ) -> dict[str, str]:
        """Headers proving this node answered the request with ``nonce`` with this body."""
        sig = _mac(
            self._keys[self.node_id],
            _ANSWER_DOMAIN,
            self.cluster_id.encode(),
            self.node_id.encode(),
            nonce.encode(),
            str(status).encode(),
            body_digest(parts),
        )
        return {HEADER_NODE: self.node_id, HEADER_CLUSTER: self.cluster_id, HEADER_SIGNATURE: sig}

    def verify_answer(
        self, peer: str, nonce: str, status: int, headers: Mapping[str, str], body: bytes | bytearray
    ) -> None:
        """ReplicaAuthError unless ``peer`` signed this answer to our request ``nonce``."""
        key = self._keys.get(peer)
        sig = headers.get(HEADER_SIGNATURE)
        if key is None or peer not in self.peers:
            raise ReplicaAuthError(f"node {peer!r} is not a replica peer of {self.node_id}")
        if not sig or headers.get(HEADER_NODE) != peer or headers.get(HEADER_CLUSTER) != self.cluster_id:
            raise ReplicaAuthError(f"answer not signed by {peer!r} of this cluster: not the real {peer}")
        _check_ascii(sig)
        expected = _mac(
            key,
            _ANSWER_DOMAIN,
            self.cluster_id.encode(),
            peer.encode(),
            nonce.encode(),
            str(status).encode(),
            body_digest([body]),
        )
        if not hmac.compare_digest(expected.encode(), sig.encode()):
            raise ReplicaAuthError(f"bad signature on the answer of {peer!r}: not the real {peer}")


def _check_ascii(*values: str) -> None:
    """Signature headers are ASCII; a byte corrupted in transit (the HTTP parser keeps it as an
    undecodable character) is an unverified call, not an encoding error nobody expects (make chaos
    seed 529091: one ended a slave's fetch loop)."""
    if not all(v.isascii() for v in values):
        raise ReplicaAuthError("malformed replica signature headers (not ASCII)")
