"""Checking an AWS Signature Version 4 on a request, as the Lambda API does before anything else.

The caller signs with its secret access key (botocore does it for every call); the check rebuilds the
canonical request from what arrived (method, path, query, the headers the signature names, the
body's SHA-256), derives the signing key from the same secret for the date, region and service of
the credential scope, and compares signatures in constant time. A request is refused when it names
another access key id, region or service, when its ``X-Amz-Date`` is more than ``MAX_SKEW_S`` from
this clock, when it signs neither ``host`` nor ``x-amz-date``, or when the signature differs.
A service checks a request's headers before it reads the body (:func:`check_headers`): a request that
declares its payload's hash (``x-amz-content-sha256``, signed) has its signature checked then, the body's
hash after; one that does not (botocore's Lambda client) has its signature checked once the body is in.
See https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from calendar import timegm
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 300  # AWS allows 15 minutes; a lab's clocks are the same clock
_AUTH = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/aws4_request,\s*"
                   r"SignedHeaders=([a-z0-9\-;]+),\s*Signature=([0-9a-f]{64})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SignatureError(Exception):
    """The request is not signed by the configured credentials; the text says why (no secret in it)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code  # the x-amzn-ErrorType AWS would answer with


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str
    region: str
    service: str = "lambda"

    def __repr__(self) -> str:  # never the secret
        return f"Credentials({self.access_key_id!r}, region={self.region!r}, service={self.service!r})"


def _h(key: bytes, text: str) -> bytes:
    return hmac.digest(key, text.encode(), "sha256")


def canonical_request(method: str, raw_path: str, query: str, headers: dict[str, list[str]], signed: list[str],
                      payload_hash: str) -> str:
    """The SigV4 canonical request (botocore's form for every service but S3: the path encoded once more)."""
    pairs = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in parse_qsl(query, keep_blank_values=True))
    lines = [f"{name}:{','.join(' '.join(v.split()) for v in headers.get(name, []))}" for name in signed]
    return "\n".join([method.upper(), quote(raw_path or "/", safe="/~"), "&".join(f"{k}={v}" for k, v in pairs),
                      *lines, "", ";".join(signed), payload_hash])


@dataclass(frozen=True)
class Pending:
    """A request whose headers passed every check; what is left is its payload (:meth:`check_body`).
    ``declared``: the payload's SHA-256 the request signs in ``x-amz-content-sha256``, if it does; its
    signature has then been checked already, before a byte of the body was read."""

    key: bytes = field(repr=False)  # the signing key of the day (derived from the secret)
    to_sign: str  # the string to sign, up to the canonical request's hash
    canonical: str  # the canonical request without its last line, the payload hash
    signature: str
    declared: str | None

    def check_body(self, body: bytes) -> None:
        digest = hashlib.sha256(body).hexdigest()
        if self.declared is not None:
            if not hmac.compare_digest(digest, self.declared):
                raise SignatureError("InvalidSignatureException", "the body's SHA-256 is not the x-amz-content-sha256 "
                                     "the request signed")
        else:
            self.check_hash(digest)

    def check_hash(self, payload_hash: str) -> None:
        """The signature, over the canonical request that ends with ``payload_hash``."""
        request = self.canonical + payload_hash
        to_sign = self.to_sign + hashlib.sha256(request.encode()).hexdigest()
        if not hmac.compare_digest(hmac.new(self.key, to_sign.encode(), "sha256").hexdigest(), self.signature):
            raise SignatureError("InvalidSignatureException", "The request signature we calculated does not match the "
                                 "signature you provided.")


def check_headers(creds: Credentials, method: str, raw_path: str, query: str, headers: dict[str, list[str]],
                  now: float | None = None) -> Pending:
    """Every check that needs no body: the key id, scope, signed names and date; and the signature too
    when the request declares its payload's hash (``x-amz-content-sha256``, signed, as S3 clients send).
    Raise :class:`SignatureError`, or return what :meth:`Pending.check_body` needs."""
    auth = (headers.get("authorization") or [""])[0]
    m = _AUTH.match(auth.strip())
    if m is None:
        raise SignatureError("MissingAuthenticationTokenException", "missing or malformed SigV4 Authorization header")
    key_id, date, region, service, signed_text, signature = m.groups()
    if not hmac.compare_digest(key_id.encode(), creds.access_key_id.encode()):
        raise SignatureError("UnrecognizedClientException", "The security token included in the request is invalid.")
    if region != creds.region or service != creds.service:
        raise SignatureError("InvalidSignatureException", f"credential scope {region}/{service}: expected "
                             f"{creds.region}/{creds.service}")
    signed = signed_text.split(";")
    if "host" not in signed or "x-amz-date" not in signed or signed != sorted(signed):
        raise SignatureError("InvalidSignatureException", "the signature must cover host and x-amz-date, names sorted")
    amz_date = (headers.get("x-amz-date") or [""])[0]
    try:
        when = timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise SignatureError("InvalidSignatureException", f"bad X-Amz-Date {amz_date[:20]!r}") from None
    if not amz_date.startswith(date) or abs((time.time() if now is None else now) - when) > MAX_SKEW_S:
        raise SignatureError("InvalidSignatureException", "Signature expired or not yet valid (X-Amz-Date is "
                             f"more than {MAX_SKEW_S} s from this server's clock, or outside the credential's date)")
    declared = None
    if "x-amz-content-sha256" in signed:
        declared = (headers.get("x-amz-content-sha256") or [""])[0]
        if not _SHA256.match(declared):
            raise SignatureError("InvalidSignatureException", "x-amz-content-sha256 must be the payload's SHA-256 "
                                 "(unsigned and streamed payloads are refused)")
    canonical = canonical_request(method, raw_path, query, headers, signed, "")
    key = _h(_h(_h(_h(("AWS4" + creds.secret_access_key).encode(), date), region), service), "aws4_request")
    pending = Pending(key, f"{ALGORITHM}\n{amz_date}\n{date}/{region}/{service}/aws4_request\n", canonical, signature,
                      declared)
    if declared is not None:
        pending.check_hash(declared)
    return pending


def verify(creds: Credentials, method: str, raw_path: str, query: str, headers: dict[str, list[str]], body: bytes,
           now: float | None = None) -> None:
    """Raise :class:`SignatureError` unless the request was signed with ``creds``. ``headers``: lower-case
    names to every value received."""
    check_headers(creds, method, raw_path, query, headers, now).check_body(body)
