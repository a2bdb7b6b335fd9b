"""The IAM actions AWS checks for an S3 REST request, read from the request itself (method, bucket, key,
query, headers, body): AWS's "Required permissions for Amazon S3 API operations", not moto's names for
them, which moto has changed between releases (5.2.6 judged a HeadObject as ``s3:HeadObject``, an action
IAM does not have). Pure code: ``actions`` is all of it.
"""

from __future__ import annotations

from urllib.parse import unquote

# bucket subresource (a query parameter) -> (GET's action, PUT's, DELETE's); "" where S3 has no such call
BUCKET_SUBRESOURCES = {
    "acl": ("GetBucketAcl", "PutBucketAcl", ""),
    "accelerate": ("GetAccelerateConfiguration", "PutAccelerateConfiguration", ""),
    "cors": ("GetBucketCORS", "PutBucketCORS", "PutBucketCORS"),
    "encryption": ("GetEncryptionConfiguration", "PutEncryptionConfiguration", "PutEncryptionConfiguration"),
    "lifecycle": ("GetLifecycleConfiguration", "PutLifecycleConfiguration", "PutLifecycleConfiguration"),
    "location": ("GetBucketLocation", "", ""),
    "logging": ("GetBucketLogging", "PutBucketLogging", ""),
    "notification": ("GetBucketNotification", "PutBucketNotification", ""),
    "object-lock": ("GetBucketObjectLockConfiguration", "PutBucketObjectLockConfiguration", ""),
    "ownershipControls": ("GetBucketOwnershipControls", "PutBucketOwnershipControls", "PutBucketOwnershipControls"),
    "policy": ("GetBucketPolicy", "PutBucketPolicy", "DeleteBucketPolicy"),
    "policyStatus": ("GetBucketPolicyStatus", "", ""),
    "publicAccessBlock": ("GetBucketPublicAccessBlock", "PutBucketPublicAccessBlock", "PutBucketPublicAccessBlock"),
    "replication": ("GetReplicationConfiguration", "PutReplicationConfiguration", "PutReplicationConfiguration"),
    "requestPayment": ("GetBucketRequestPayment", "PutBucketRequestPayment", ""),
    "tagging": ("GetBucketTagging", "PutBucketTagging", "PutBucketTagging"),
    "uploads": ("ListBucketMultipartUploads", "", ""),
    "versioning": ("GetBucketVersioning", "PutBucketVersioning", ""),
    "versions": ("ListBucketVersions", "", ""),
    "website": ("GetBucketWebsite", "PutBucketWebsite", "DeleteBucketWebsite"),
}
# object subresource -> (GET's action, PUT's, DELETE's)
OBJECT_SUBRESOURCES = {
    "acl": ("GetObjectAcl", "PutObjectAcl", ""),
    "attributes": ("GetObjectAttributes", "", ""),
    "legal-hold": ("GetObjectLegalHold", "PutObjectLegalHold", ""),
    "retention": ("GetObjectRetention", "PutObjectRetention", ""),
    "tagging": ("GetObjectTagging", "PutObjectTagging", "DeleteObjectTagging"),
    "uploadId": ("ListMultipartUploadParts", "PutObject", "AbortMultipartUpload"),  # PUT: UploadPart
}
VERB = {"GET": 0, "HEAD": 0, "PUT": 1, "DELETE": 2}


def actions(method: str, bucket: str, key: str, query: dict, headers: dict | None = None,
            body: bytes | str = b"") -> list[tuple[str, str, dict]]:
    """The ``(action, resource ARN, condition context)`` checks of one S3 request: one, except for a
    multi-object delete (one per object, as S3 checks them) and a copy (the source is read too)."""
    method, headers = method.upper(), {k.lower(): v for k, v in (headers or {}).items()}
    if not bucket:
        return [("s3:ListAllMyBuckets", "*", {})]
    bucket_arn = f"arn:aws:s3:::{bucket}"
    if not key:
        if method == "POST" and "delete" in query:
            return [(f"s3:DeleteObject{'Version' if version else ''}", f"{bucket_arn}/{name}", {})
                    for name, version in deleted_objects(body)]
        action = _by_subresource(BUCKET_SUBRESOURCES, method, query)
        if not action:
            action = {"GET": "ListBucket", "HEAD": "ListBucket", "PUT": "CreateBucket", "DELETE": "DeleteBucket"}.get(
                method, f"Unknown{method.title()}Bucket")
        context = {"s3:prefix": query["prefix"]} if action in ("ListBucket", "ListBucketVersions") and "prefix" in query else {}
        return [(f"s3:{action}", bucket_arn, context)]
    arn = f"{bucket_arn}/{key}"
    if method == "POST":  # CreateMultipartUpload and CompleteMultipartUpload write the object
        action = "RestoreObject" if "restore" in query else "GetObject" if "select" in query else "PutObject"
        return [(f"s3:{action}", arn, {})]
    action = _by_subresource(OBJECT_SUBRESOURCES, method, query)
    versioned = "versionId" in query
    if action in ("GetObjectTagging", "PutObjectTagging", "DeleteObjectTagging", "GetObjectAcl") and versioned:
        action = action.replace("Object", "ObjectVersion", 1)
    elif not action:
        action = {"GET": "GetObject", "HEAD": "GetObject", "PUT": "PutObject", "DELETE": "DeleteObject"}.get(
            method, f"Unknown{method.title()}Object")
        if versioned and action in ("GetObject", "DeleteObject"):
            action += "Version"
    found = [(f"s3:{action}", arn, {})]
    source = headers.get("x-amz-copy-source", "")
    if method == "PUT" and source and "uploadId" not in query:  # CopyObject: read the source, write the copy
        found.insert(0, ("s3:GetObject", f"arn:aws:s3:::{unquote(source.lstrip('/').split('?')[0])}", {}))
    return found


def _by_subresource(table: dict, method: str, query: dict) -> str:
    column = VERB.get(method)
    if column is None:
        return ""
    return next((table[name][column] for name in table if name in query and table[name][column]), "")


def deleted_objects(body: bytes | str) -> list[tuple[str, str]]:
    """(key, version id or "") of each ``<Object>`` of a DeleteObjects request body."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(body)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    return [(o.findtext(f"{ns}Key", ""), o.findtext(f"{ns}VersionId", "")) for o in root.iter(f"{ns}Object")]
