# Graph and weight servers. Each boots, installs the package, writes the cluster file and starts
# `dorylus graph-server` / `dorylus weight-server` as a systemd service with the shared job token.

data "aws_ssm_parameter" "al2023" {
  name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

resource "random_password" "job_token" {
  length  = 32
  special = false
}

resource "aws_instance" "graph_server" {
  # checkov:skip=CKV_AWS_126: detailed monitoring is billed per instance; dorylus records its own timings
  # checkov:skip=CKV2_AWS_41: the instance profile is attached (aws_iam_instance_profile.server)
  # checkov:skip=CKV_AWS_88: a public address instead of a NAT gateway (about 32 USD a month plus data) for pip at
  #   boot and operator SSH; the security group admits only operator_cidr, the Lambdas and the servers
  count                       = var.graph_server_count
  ami                         = data.aws_ssm_parameter.al2023.value
  instance_type               = var.graph_server_type
  subnet_id                   = aws_subnet.servers.id
  private_ip                  = local.graph_server_ips[count.index]
  associate_public_ip_address = true # SSH from operator_cidr; pip install at boot
  vpc_security_group_ids      = [aws_security_group.servers.id]
  iam_instance_profile        = aws_iam_instance_profile.server.name
  key_name                    = var.key_name == "" ? null : var.key_name
  ebs_optimized               = true
  user_data_replace_on_change = true
  user_data = templatefile("${path.module}/templates/server.sh.tftpl", {
    role         = "graph-server", rank = count.index, package = var.package_spec, token = random_password.job_token.result,
    cluster_json = jsonencode(local.cluster), region = var.region
  })
  metadata_options {
    http_tokens   = "required" # IMDSv2 only
    http_endpoint = "enabled"
  }
  root_block_device {
    volume_size = 100
    encrypted   = true
  }
  tags = { Name = "${var.name}-graph-server-${count.index}" }
}

resource "aws_instance" "weight_server" {
  # checkov:skip=CKV_AWS_126: detailed monitoring is billed per instance; dorylus records its own timings
  # checkov:skip=CKV2_AWS_41: the instance profile is attached (aws_iam_instance_profile.server)
  # checkov:skip=CKV_AWS_88: as for the graph servers: public address instead of a NAT gateway, SG-restricted
  count                       = var.weight_server_count
  ami                         = data.aws_ssm_parameter.al2023.value
  instance_type               = var.weight_server_type
  subnet_id                   = aws_subnet.servers.id
  private_ip                  = local.weight_server_ips[count.index]
  associate_public_ip_address = true # SSH from operator_cidr; pip install at boot
  vpc_security_group_ids      = [aws_security_group.servers.id]
  iam_instance_profile        = aws_iam_instance_profile.server.name
  key_name                    = var.key_name == "" ? null : var.key_name
  ebs_optimized               = true
  user_data_replace_on_change = true
  user_data = templatefile("${path.module}/templates/server.sh.tftpl", {
    role         = "weight-server", rank = count.index, package = var.package_spec, token = random_password.job_token.result,
    cluster_json = jsonencode(local.cluster), region = var.region
  })
  metadata_options {
    http_tokens   = "required" # IMDSv2 only
    http_endpoint = "enabled"
  }
  root_block_device {
    volume_size = 30
    encrypted   = true
  }
  tags = { Name = "${var.name}-weight-server-${count.index}" }
}
