"""The object primitives (objects.py) on an S3-compatible store, through boto3.

boto3 because it sends ``If-None-Match`` / ``If-Match`` on ``PutObject`` as plain, visible request
parameters and reports S3's error codes unchanged, so what the protocol relies on is exactly what
goes on the wire (and what the conformance test checks). Not ``pyarrow.fs``: it sends no
precondition and silently overwrites. Credentials come from boto3's standard chain (the AWS
variables, profiles, instance roles); ``endpoint_url`` and ``region`` select an S3-compatible store.

botocore retries transient failures itself (standard mode). A retried create-only put whose first
attempt did land answers 412: harmless, because the claim chain reads every uncertain claim back
and recognises its own nonce.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from mqd.landing.errors import ObjectStoreError, PreconditionFailed
from mqd.landing.objects import ObjectInfo

MULTIPART_THRESHOLD = 64 * 1024 * 1024  # staged files below this go up in one request
# a streamed staged file (open_upload) goes up in parts of this size as it is written: S3's
# minimum part is 5 MiB (the last excepted); larger parts mean fewer requests, more memory per
# open file (one part buffered per partition being written)
PART_BYTES = 8 * 1024 * 1024


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket/prefix`` (prefix without the trailing '/', may be '')."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, prefix.strip("/")


class S3Objects:
    """Objects under ``s3://bucket/prefix``. Thread-safe: boto3 clients may be shared by threads."""

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
    ) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self._uri = uri.rstrip("/")
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                config=Config(
                    retries={"mode": "standard", "max_attempts": 3},
                    connect_timeout=5,
                    read_timeout=30,
                    max_pool_connections=16,
                ),
            )
        self.client = client

    @property
    def location(self) -> str:
        return self._uri

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _error(self, exc: Exception, what: str) -> ObjectStoreError:
        return ObjectStoreError(f"{self._uri}: {what}: {exc}")

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        """One client call; (code, status) of an S3 error answer are returned as an exception the
        callers below sort out, transport errors become ObjectStoreError."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            raise _S3Answer(exc, what) from None
        except BotoCoreError as exc:
            raise self._error(exc, what) from None

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        cond: dict[str, str] = {}
        if if_absent:
            cond["IfNoneMatch"] = "*"
        if if_match is not None:
            cond["IfMatch"] = if_match
        try:
            r = self._call(f"put {key}", self.client.put_object, Key=self._key(key), Body=data, **cond)
        except _S3Answer as ans:
            # 412: the condition failed. 404 on If-Match: no such object, the etag cannot match.
            if cond and (ans.status == 412 or (if_match is not None and ans.status == 404)):
                raise PreconditionFailed(f"{key}: {ans.code}") from None
            raise self._error(ans.exc, f"put {key}") from None
        return str(r["ETag"])

    def upload(self, key: str, path: Path) -> None:
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(
                str(path),
                self.bucket,
                self._key(key),
                Config=TransferConfig(multipart_threshold=MULTIPART_THRESHOLD),
            )
        except (ClientError, BotoCoreError, OSError) as exc:
            raise self._error(exc, f"upload {key}") from None

    def open_upload(self, key: str) -> S3Upload:
        """A streamed, unconditional write of the fresh key ``key`` (a staged file): parts of
        ``PART_BYTES`` go up as they fill (multipart), or one PUT when the object stays smaller."""
        return S3Upload(self, key)

    def remove_stale_uploads(self, prefix: str, older_than_s: float) -> int:
        """Abort multipart uploads under ``prefix`` started more than ``older_than_s`` ago (open
        staged files of a crashed daemon: no listing shows them, but they cost storage); returns
        how many. Age only decides cost: a live upload's loss fails its publication (retried)."""
        cutoff = time.time() - older_than_s
        removed = 0
        kwargs: dict[str, Any] = {"Prefix": self._key(prefix)}
        while True:
            try:
                r = self._call(f"list uploads {prefix}", self.client.list_multipart_uploads, **kwargs)
            except _S3Answer as ans:
                raise self._error(ans.exc, f"list uploads {prefix}") from None
            for u in r.get("Uploads", []):
                if u["Initiated"].timestamp() >= cutoff:
                    continue
                try:
                    self._call(
                        f"abort upload {u['Key']}",
                        self.client.abort_multipart_upload,
                        Key=u["Key"],
                        UploadId=u["UploadId"],
                    )
                    removed += 1
                except _S3Answer as ans:
                    if ans.status != 404:
                        raise self._error(ans.exc, f"abort upload {u['Key']}") from None
            if not r.get("IsTruncated"):
                return removed
            kwargs["KeyMarker"] = r.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = r.get("NextUploadIdMarker", "")

    def get(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import BotoCoreError

        try:
            r = self._call(f"get {key}", self.client.get_object, Key=self._key(key))
            return r["Body"].read(), str(r["ETag"])
        except _S3Answer as ans:
            if ans.status == 404:
                return None
            raise self._error(ans.exc, f"get {key}") from None
        except BotoCoreError as exc:  # the body's stream broke
            raise self._error(exc, f"get {key}") from None

    def head(self, key: str) -> ObjectInfo | None:
        try:
            r = self._call(f"head {key}", self.client.head_object, Key=self._key(key))
        except _S3Answer as ans:
            if ans.status == 404:
                return None
            raise self._error(ans.exc, f"head {key}") from None
        return ObjectInfo(key, int(r["ContentLength"]), str(r["ETag"]), r["LastModified"].timestamp())

    def copy(self, src: str, dst: str) -> bool:
        try:
            self._call(
                f"copy {src} -> {dst}",
                self.client.copy_object,
                Key=self._key(dst),
                CopySource={"Bucket": self.bucket, "Key": self._key(src)},
            )
        except _S3Answer as ans:
            if ans.status == 404 and ans.code in ("NoSuchKey", "404"):
                return False
            raise self._error(ans.exc, f"copy {src} -> {dst}") from None
        return True

    def list_objects(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        kwargs: dict[str, Any] = {"Prefix": self._key(prefix)}
        if start_after:
            kwargs["StartAfter"] = self._key(start_after)
        while True:
            try:
                r = self._call(f"list {prefix}", self.client.list_objects_v2, **kwargs)
            except _S3Answer as ans:
                raise self._error(ans.exc, f"list {prefix}") from None
            for o in r.get("Contents", []):
                yield ObjectInfo(
                    self._rel(o["Key"]), int(o["Size"]), str(o.get("ETag", "")), o["LastModified"].timestamp()
                )
            if not r.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = r["NextContinuationToken"]
            kwargs.pop("StartAfter", None)

    def list_dirs(self, prefix: str) -> list[str]:
        kwargs: dict[str, Any] = {"Prefix": self._key(prefix), "Delimiter": "/"}
        out: list[str] = []
        while True:
            try:
                r = self._call(f"list {prefix}", self.client.list_objects_v2, **kwargs)
            except _S3Answer as ans:
                raise self._error(ans.exc, f"list {prefix}") from None
            out.extend(self._rel(p["Prefix"]) for p in r.get("CommonPrefixes", []))
            if not r.get("IsTruncated"):
                return out
            kwargs["ContinuationToken"] = r["NextContinuationToken"]

    def delete(self, key: str) -> None:
        try:
            self._call(f"delete {key}", self.client.delete_object, Key=self._key(key))
        except _S3Answer as ans:
            if ans.status != 404:
                raise self._error(ans.exc, f"delete {key}") from None


class S3Upload:
    """One object written as a stream (S3Objects.open_upload): a file-like ``write`` (what
    pyarrow's writer calls), ``complete`` and ``abort``. Not thread-safe: one writer thread.
    Multipart is unconditional, which is fine for a staged key: it is fresh, and only a claim
    (a single-part conditional PUT) ever makes it count.

    The part being filled waits in an unnamed local temp file, not in memory: a daemon may have
    an open file on every partition, and only a part being sent (one per landing worker) is read
    into memory, so the process's memory stays within the consumer's byte budget plus a part per
    worker."""

    def __init__(self, objects: S3Objects, key: str) -> None:
        self._objects = objects
        self._key = objects._key(key)
        self.key = key
        self._buf: IO[bytes] | None = None
        self._buffered = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self.size = 0
        self.closed = False

    def _take(self) -> bytes:
        """The buffered bytes (read into memory to be sent), the buffer emptied."""
        if self._buf is None:
            return b""
        self._buf.seek(0)
        data = self._buf.read()
        self._buf.seek(0)
        self._buf.truncate()
        self._buffered = 0
        return data

    def _send_part(self) -> None:
        c = self._objects.client
        if self._upload_id is None:
            r = self._call("create multipart", c.create_multipart_upload, Key=self._key)
            self._upload_id = str(r["UploadId"])
        n = len(self._parts) + 1
        r = self._call(
            "upload part",
            c.upload_part,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=n,
            Body=self._take(),
        )
        self._parts.append({"PartNumber": n, "ETag": r["ETag"]})

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return self._objects._call(f"{what} {self.key}", fn, **kwargs)
        except _S3Answer as ans:
            raise self._objects._error(ans.exc, f"{what} {self.key}") from None

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if self._buf is None:
            self._buf = tempfile.TemporaryFile(prefix="mqd-part-")  # closed by complete() or abort()
        self._buf.write(data)
        self._buffered += n
        self.size += n
        if self._buffered >= PART_BYTES:
            self._send_part()
        return n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True  # pyarrow closes its file object; complete() or abort() ends the upload

    def complete(self) -> int:
        c = self._objects.client
        try:
            if self._upload_id is None:
                self._call("put", c.put_object, Key=self._key, Body=self._take())
            else:
                if self._buffered:
                    self._send_part()
                self._call(
                    "complete multipart",
                    c.complete_multipart_upload,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                )
        finally:
            self._close_buffer()
        return self.size

    def _close_buffer(self) -> None:
        buf, self._buf = self._buf, None
        if buf is not None:
            buf.close()

    def abort(self) -> None:
        self._close_buffer()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            try:
                self._objects.client.abort_multipart_upload(
                    Bucket=self._objects.bucket, Key=self._key, UploadId=upload_id
                )
            except Exception:  # the janitor (or a bucket lifecycle rule) ends it
                pass


class _S3Answer(Exception):
    """An S3 error answer (internal: each operation decides what its codes mean)."""

    def __init__(self, exc: Any, what: str) -> None:
        super().__init__(what)
        self.exc = exc
        err = exc.response.get("Error", {})
        self.code = str(err.get("Code", ""))
        self.status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
