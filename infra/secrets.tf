# The job key that signs every message. Terraform makes only the secret's container; its value is
# written by `dorylus aws put-secret` (docs/aws.md), so the key is in no state file, user data, output
# or Lambda payload. Servers and the Lambda read it at start through their roles (iam.tf), the Lambdas
# through an interface endpoint, as their subnets have no route out.

resource "aws_secretsmanager_secret" "job_key" {
  # checkov:skip=CKV2_AWS_57: rotation is `dorylus aws put-secret` between jobs; rotating under a running job would split it
  name_prefix             = "${var.name}-job-key-"
  description             = "HMAC-SHA256 key of dorylus jobs; value set by `dorylus aws put-secret`, never by Terraform"
  kms_key_id              = aws_kms_key.data.arn
  recovery_window_in_days = 7
}

resource "aws_security_group" "endpoints" {
  name        = "${var.name}-endpoints"
  description = "Interface endpoints: HTTPS from the Lambdas and the servers only"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "endpoints_from_lambda" {
  security_group_id            = aws_security_group.endpoints.id
  description                  = "Secrets Manager endpoint, from the Lambdas"
  referenced_security_group_id = aws_security_group.lambda.id
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
}

resource "aws_vpc_security_group_ingress_rule" "endpoints_from_servers" {
  security_group_id            = aws_security_group.endpoints.id
  description                  = "Secrets Manager endpoint, from the servers (private DNS resolves to it VPC-wide)"
  referenced_security_group_id = aws_security_group.servers.id
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
}

resource "aws_vpc_security_group_egress_rule" "lambda_to_endpoints" {
  security_group_id            = aws_security_group.lambda.id
  description                  = "Lambdas read the job key through the Secrets Manager endpoint"
  referenced_security_group_id = aws_security_group.endpoints.id
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
}

resource "aws_vpc_endpoint" "secretsmanager" {
  vpc_id              = aws_vpc.main.id
  service_name        = "com.amazonaws.${var.region}.secretsmanager"
  vpc_endpoint_type   = "Interface"
  subnet_ids          = aws_subnet.lambda[*].id
  security_group_ids  = [aws_security_group.endpoints.id]
  private_dns_enabled = true
  policy              = data.aws_iam_policy_document.endpoint.json
}

data "aws_iam_policy_document" "endpoint" {
  # Through this endpoint, only the job key can be read, and only by this deployment's roles.
  statement {
    sid       = "ReadJobKeyOnly"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.job_key.arn]
    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.lambda.arn, aws_iam_role.server.arn]
    }
  }
}
