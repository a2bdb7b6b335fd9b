"""Partition stores in S3: ``s3://bucket/prefix`` holds the same files as a prepared folder.

Writing uploads a finished local store, ``manifest.json`` last, so a reader never sees a manifest whose
files are not all there. Reading fetches the manifest and then only the partition a graph server
needs, into a local cache (``$DORYLUS_CACHE``, default ``~/.cache/dorylus``), checking each file's size
and SHA-256 against the manifest; a missing or corrupt object is named by its ``s3://`` address and
never used. Credentials, region and endpoint come from the standard AWS chain (``AWS_PROFILE``,
``AWS_REGION``, ``AWS_ENDPOINT_URL`` for moto or LocalStack).

Absence is learnt by listing, never from a failed read: S3 answers a read of a missing key with 403
AccessDenied, not 404, to a caller without ``s3:ListBucket`` (how a prefix condition on that permission
counts is not documented), so a 403 is a permission problem, named with its fix, unless a listing shows
the key is not there.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from pathlib import Path

from dorylus_py.checksum import sha256_file
from dorylus_py.errors import DataError

SCHEME = "s3://"


class Missing(DataError):
    """The object is not there (as opposed to there but unreadable, or access denied)."""


def is_s3(uri) -> bool:
    return str(uri).startswith(SCHEME)


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> (``bucket``, ``a/b``), without a trailing slash. Checked so that the
    address can name a local cache folder too: a bucket name as S3 allows it, and a prefix of plain
    path segments (no ``.``, ``..`` or empty ones), so that no cache path leaves its folder."""
    bucket, _, prefix = str(uri)[len(SCHEME):].partition("/")
    if not bucket:
        raise DataError(f"{uri}: no bucket name (expected s3://BUCKET/PREFIX)")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket) or ".." in bucket:
        raise DataError(f"{uri}: {bucket[:70]!r} is not an S3 bucket name")
    prefix = prefix.strip("/")
    if prefix and any(seg in ("", ".", "..") or "\\" in seg or "\0" in seg for seg in prefix.split("/")):
        raise DataError(f"{uri}: the prefix has empty, '.' or '..' segments")
    return bucket, prefix


def client():
    """One S3 client per AWS setting in the environment (making one takes ~30 ms here; a partition is
    several files). Keyed by the variables that choose the account and endpoint, so a changed setting
    gets a new client."""
    env = tuple(os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
                                            "AWS_ACCESS_KEY_ID"))
    return _client(env)


@functools.lru_cache(maxsize=4)
def _client(env: tuple):
    try:
        import boto3
    except ImportError:
        raise DataError("s3:// paths need boto3: pip install 'dorylus-py[aws]'") from None
    return boto3.client("s3")


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


# A HEAD response has no body, so botocore's code is the bare HTTP status: name it as a GET's would be.
HEAD_CODES = {"403": "AccessDenied", "404": "NotFound"}
ABSENT = ("404", "NoSuchKey", "NotFound")
DENIED_FIX = ("the caller needs s3:ListBucket on the bucket for this prefix and s3:GetObject (s3:PutObject to write) "
              "on the key; on infra/'s deployment the servers' role has them under datasets/ (read) and "
              "checkpoints/ (read, write) only (infra/iam.tf)")


def _code(e) -> str:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    return HEAD_CODES.get(code, code)


def _error(e, what: str) -> DataError:
    code = _code(e)
    if code == "AccessDenied":
        return DataError(f"{what}: AccessDenied: {DENIED_FIX}")
    return DataError(f"{what}: {code} ({e})")


def _listed(s3, bucket: str, key: str) -> bool:
    """Whether ``key`` is in ``bucket``, by listing its name as a prefix: the key itself, if there, is the
    first name the listing returns (a name sorts before every longer one it begins)."""
    page = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    return any(o["Key"] == key for o in page.get("Contents", []))


def upload_store(local: Path, uri: str, overwrite: bool = False, progress=None) -> None:
    """Upload the prepared folder ``local`` to ``uri``; the manifest goes last."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split(uri)
    s3 = client()
    say = progress or (lambda msg: None)
    try:
        s3.head_bucket(Bucket=bucket)
        existing = s3.list_objects_v2(Bucket=bucket, Prefix=_key(prefix, "")).get("KeyCount", 0)
        if existing and not overwrite:
            raise DataError(f"{uri}: already holds objects (pass --overwrite to replace them)")
        if existing:
            delete_prefix(s3, bucket, prefix)
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != "manifest.json")
        for i, path in enumerate(files):
            say(f"uploading {i + 1}/{len(files)}: {path.relative_to(local)}")
            s3.upload_file(str(path), bucket, _key(prefix, path.relative_to(local).as_posix()))
        s3.upload_file(str(local / "manifest.json"), bucket, _key(prefix, "manifest.json"))
    except (ClientError, BotoCoreError) as e:
        raise _error(e, uri) from None


def put_file(uri: str, name: str, path: Path) -> None:
    """Upload one local file to ``uri/name``."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split(uri)
    try:
        client().upload_file(str(path), bucket, _key(prefix, name))
    except (ClientError, BotoCoreError, S3UploadFailedError) as e:  # a refused upload_file is the last
        raise _error(e, f"{uri.rstrip('/')}/{name}") from None


def count_objects(uri: str) -> int:
    """How many objects lie under ``uri/``."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split(uri)
    try:
        pages = client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=_key(prefix, ""))
        return sum(page.get("KeyCount", 0) for page in pages)
    except (ClientError, BotoCoreError) as e:
        raise _error(e, uri) from None


def list_names(uri: str) -> list[str]:
    """The objects under ``uri/``, as paths relative to it."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split(uri)
    start = _key(prefix, "")
    try:
        pages = client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start)
        return [o["Key"][len(start):] for page in pages for o in page.get("Contents", [])]
    except (ClientError, BotoCoreError) as e:
        raise _error(e, uri) from None


def read_small(uri: str, name: str, cap: int) -> bytes | None:
    """``uri/name``'s bytes (None: no such object); one over ``cap`` bytes is refused unread."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split(uri)
    where = f"{uri.rstrip('/')}/{name}"
    s3, key = client(), _key(prefix, name)
    try:
        if not _listed(s3, bucket, key):
            return None
        obj = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{cap}")
        body = obj["Body"].read(cap + 1)
    except ClientError as e:
        if _code(e) in ABSENT:  # deleted since the listing
            return None
        raise _error(e, where) from None
    except BotoCoreError as e:
        raise _error(e, where) from None
    if len(body) > cap:
        raise DataError(f"{where}: larger than {cap} bytes")
    return body


def delete_prefix(s3, bucket: str, prefix: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=_key(prefix, "")):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})


def cache_dir(uri: str) -> Path:
    bucket, prefix = split(uri)
    root = Path(os.environ.get("DORYLUS_CACHE", Path.home() / ".cache" / "dorylus"))
    return root / "s3" / bucket / prefix


def fetch(uri: str, name: str, dest: Path, size: int | None = None, sha256: str | None = None) -> Path:
    """Download ``uri/name`` to ``dest`` and check it; a copy already there that matches ``size`` (and
    ``sha256``, if given) is kept. Safe when several processes fetch the same file at once: each
    downloads to a file of its own and renames it into place."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split(uri)
    where = f"{uri.rstrip('/')}/{name}"
    if size is not None and dest.exists() and dest.stat().st_size == size and (sha256 is None or sha256_file(dest) == sha256):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            client().download_file(bucket, _key(prefix, name), str(tmp))
        except ClientError as e:
            if _code(e) in (*ABSENT, "NoSuchBucket") or (_code(e) == "AccessDenied" and not _there(bucket, prefix, name, where)):
                raise Missing(f"{where}: missing") from None
            raise _error(e, where) from None
        except BotoCoreError as e:
            raise _error(e, where) from None
        if size is not None and tmp.stat().st_size != size:
            raise DataError(f"{where}: {tmp.stat().st_size} bytes, manifest says {size} (truncated?)")
        if sha256 is not None and sha256_file(tmp) != sha256:
            raise DataError(f"{where}: checksum mismatch with the manifest (corrupt object)")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _there(bucket: str, prefix: str, name: str, where: str) -> bool:
    """After a read was refused: whether the object is there at all (a refused listing is the error)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return _listed(client(), bucket, _key(prefix, name))
    except (ClientError, BotoCoreError) as e:
        raise _error(e, where) from None
