# The tensor worker: lambda_functions/handler.py in a container image (torch is too big for a zip).

resource "aws_cloudwatch_log_group" "lambda" {
  # checkov:skip=CKV_AWS_158: KMS for logs needs a key policy for the logs service; logs hold no data
  # checkov:skip=CKV_AWS_338: a year of logs is not needed for training jobs; retention is a variable
  name              = "/aws/lambda/${var.name}-tensor"
  retention_in_days = var.log_retention_days
}

resource "aws_lambda_function" "tensor" {
  # checkov:skip=CKV_AWS_116: a failed tensor task is relaunched by the graph server; a DLQ adds nothing
  # checkov:skip=CKV_AWS_272: code signing does not apply to container images
  # checkov:skip=CKV_AWS_173: the only variable is the job key secret's ARN, a name, not a secret
  # checkov:skip=CKV_AWS_50: X-Ray tracing costs per trace; tasks.jsonl records every invocation
  function_name                  = "${var.name}-tensor"
  role                           = aws_iam_role.lambda.arn
  package_type                   = "Image"
  image_uri                      = var.lambda_image_uri
  memory_size                    = var.lambda_memory_mb
  timeout                        = var.lambda_timeout_s
  reserved_concurrent_executions = var.lambda_reserved_concurrency
  environment {
    variables = {
      DORYLUS_KEY_SECRET = aws_secretsmanager_secret.job_key.arn # read once per container, at cold start
    }
  }
  vpc_config {
    subnet_ids         = aws_subnet.lambda[*].id # the servers' zone (and one more with lambda_zone_count = 2)
    security_group_ids = [aws_security_group.lambda.id]
  }
  depends_on = [aws_cloudwatch_log_group.lambda, aws_iam_role_policy.lambda]
  lifecycle {
    # `dorylus aws update-function` puts later images live; an apply (force_destroy's, say) must not put
    # the function back on the first one
    ignore_changes = [image_uri]
    precondition {
      condition     = var.lambda_image_uri != ""
      error_message = "lambda_image_uri: give the image pushed in docs/aws.md section 1 (-var lambda_image_uri=$REPO:v1)."
    }
  }
}
