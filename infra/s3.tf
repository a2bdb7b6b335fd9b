# Datasets (dorylus prepare --out s3://BUCKET/datasets/NAME): encrypted, versioned, never public.
# (Checkpoints live in the driver's run folder.) The same KMS key encrypts the job key's secret (secrets.tf).

resource "aws_s3_bucket" "data" {
  # checkov:skip=CKV_AWS_144: cross-region replication doubles storage cost; datasets can be re-prepared
  # checkov:skip=CKV_AWS_18: access logging needs a second bucket; CloudTrail data events cover audits
  # checkov:skip=CKV2_AWS_62: no consumer of bucket event notifications in this deployment
  bucket_prefix = "${var.name}-data-"
  force_destroy = var.force_destroy # off by default: destroy stops at a bucket that still holds data
}

resource "aws_s3_bucket_server_side_encryption_configuration" "data" {
  bucket = aws_s3_bucket.data.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.data.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_kms_key" "data" {
  description             = "${var.name} datasets and the job key"
  enable_key_rotation     = true
  deletion_window_in_days = 7
  policy                  = data.aws_iam_policy_document.kms.json
}

data "aws_caller_identity" "current" {}

# The identity running the apply, as a principal a key policy can name (an assumed role's role, not its session).
data "aws_iam_session_context" "operator" {
  arn = data.aws_caller_identity.current.arn
}

data "aws_iam_policy_document" "kms" {
  # checkov:skip=CKV_AWS_109: a key policy's "*" resource is this key only; the account root must administer it
  # checkov:skip=CKV_AWS_111: same: "*" in a key policy is the key itself, not every resource
  # checkov:skip=CKV_AWS_356: same
  statement {
    sid       = "AccountAdministersTheKey"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy, "*" means this key
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
  statement {
    # The operator's IAM policy grants no KMS key: what it may do with a key, and to retire it, this key's
    # policy grants, so no other key of the account can be decrypted with or deleted through it.
    sid = "OperatorUsesAndRetiresTheKey"
    actions = [
      "kms:Decrypt", "kms:DescribeKey", "kms:EnableKeyRotation", "kms:GenerateDataKey", "kms:GetKeyPolicy",
      "kms:GetKeyRotationStatus", "kms:ListResourceTags", "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion",
    ]
    resources = ["*"] # in a key policy, "*" means this key
    principals {
      type        = "AWS"
      identifiers = length(var.operator_arns) > 0 ? var.operator_arns : [data.aws_iam_session_context.operator.issuer_arn]
    }
  }
  statement {
    sid       = "ServersUseTheKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = ["*"] # in a key policy, "*" means this key
    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.server.arn]
    }
  }
  statement {
    # The Lambda decrypts the job key's secret, and nothing else, with this key.
    sid       = "LambdaReadsTheJobKey"
    actions   = ["kms:Decrypt"]
    resources = ["*"] # in a key policy, "*" means this key
    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.lambda.arn]
    }
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_s3_bucket_versioning" "data" {
  bucket = aws_s3_bucket.data.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "data" {
  bucket = aws_s3_bucket.data.id
  rule {
    id     = "expire-old-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 30
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }
}

resource "aws_s3_bucket_public_access_block" "data" {
  bucket                  = aws_s3_bucket.data.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.data.arn, "${aws_s3_bucket.data.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "data" {
  bucket = aws_s3_bucket.data.id
  policy = data.aws_iam_policy_document.bucket.json
}
