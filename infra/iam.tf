# Least privilege. Lambda: write its own logs, the ENI calls AWS requires of any function in a VPC,
# read the job key's secret. Servers: read their wheel and the dataset prefix, list, read and write the
# checkpoint prefix (the driver on graph server 0 writes there), invoke that one function and read its
# memory size (what AWS bills a run for), read the job key's secret. Every action is used by a step of
# `dorylus aws rehearse` or listed in docs/aws.md with why (tests/aws/test_rehearsal.py checks both).

data "aws_iam_policy_document" "lambda_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "lambda" {
  # checkov:skip=CKV_AWS_111: the ENI actions below cannot be scoped to resources (see the statement)
  # checkov:skip=CKV_AWS_356: same: AWS documents "*" as the only resource these ENI actions accept
  statement {
    sid       = "OwnLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.lambda.arn}:*"]
  }
  statement {
    # A function in a VPC manages its network interfaces; these actions do not support resource-level
    # permissions, so "*" is what AWS's own AWSLambdaVPCAccessExecutionRole grants.
    sid = "VpcNetworkInterfaces"
    actions = [
      "ec2:CreateNetworkInterface",
      "ec2:DescribeNetworkInterfaces",
      "ec2:DeleteNetworkInterface",
      "ec2:AssignPrivateIpAddresses",
      "ec2:UnassignPrivateIpAddresses",
    ]
    resources = ["*"]
  }
  statement {
    sid       = "ReadJobKey"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.job_key.arn]
  }
}

resource "aws_iam_role" "lambda" {
  name               = "${var.name}-lambda"
  assume_role_policy = data.aws_iam_policy_document.lambda_assume.json
}

resource "aws_iam_role_policy" "lambda" {
  name   = "${var.name}-lambda"
  role   = aws_iam_role.lambda.id
  policy = data.aws_iam_policy_document.lambda.json
}

data "aws_iam_policy_document" "server_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "server" {
  statement {
    # Reading a key needs it too: S3 answers a read of a missing key with AccessDenied, not 404, to a
    # caller that may not list it, and the code learns absence (the first checkpoint's latest.json) by
    # listing the key's name, never from a failed read (dorylus_py/s3.py).
    sid       = "ListDatasetsAndCheckpoints"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.data.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.dataset_prefix}/*", "${var.checkpoint_prefix}/*"]
    }
  }
  statement {
    sid       = "ReadDatasets"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.data.arn}/${var.dataset_prefix}/*"]
  }
  statement {
    sid       = "ReadServerWheel"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.data.arn}/${aws_s3_object.server_wheel.key}"]
  }
  statement {
    sid       = "Checkpoints"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${aws_s3_bucket.data.arn}/${var.checkpoint_prefix}/*"]
  }
  statement {
    sid       = "ReadJobKey"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.job_key.arn]
  }
  statement {
    sid       = "InvokeTensorWorker"
    actions   = ["lambda:InvokeFunction"]
    resources = [aws_lambda_function.tensor.arn]
  }
  statement {
    sid       = "ReadTensorWorkerMemory" # every --backend lambda start reads what AWS bills (MemorySize)
    actions   = ["lambda:GetFunctionConfiguration"]
    resources = [aws_lambda_function.tensor.arn]
  }
}

resource "aws_iam_role" "server" {
  name               = "${var.name}-server"
  assume_role_policy = data.aws_iam_policy_document.server_assume.json
}

resource "aws_iam_role_policy" "server" {
  name   = "${var.name}-server"
  role   = aws_iam_role.server.id
  policy = data.aws_iam_policy_document.server.json
}

resource "aws_iam_instance_profile" "server" {
  name = "${var.name}-server"
  role = aws_iam_role.server.name
}
