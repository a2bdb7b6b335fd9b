# Graph and weight servers. Each boots, installs this project's wheel (from the bucket) and its locked
# dependencies (server-requirements.txt), every file checked against its SHA-256, writes the cluster file
# and starts `dorylus graph-server` / `dorylus weight-server` as a hardened systemd service. User data
# holds nothing secret: the cluster file names the job key's secret, read at start through the role.
# With graph_server_ami (a GPU image), the graph servers keep the image's CUDA torch: the lock's CPU
# torch is left out of their requirements and their environment sees the image's (server.sh.tftpl).

data "aws_ssm_parameter" "al2023" {
  name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

# The Amazon Linux 2023 image of the first apply, kept: a later apply (docs/aws.md's force_destroy=true
# before destroy, say) must not replace every server, and lose the run records on graph server 0, because
# AWS published a newer image meanwhile. `terraform apply -replace=terraform_data.al2023` takes the newest.
resource "terraform_data" "al2023" {
  input = data.aws_ssm_parameter.al2023.insecure_value # a public parameter: an image id, nothing secret
  lifecycle {
    ignore_changes = [input]
  }
}

locals {
  gpu_image = var.graph_server_ami != ""
  lock      = trimspace(file("${path.module}/server-requirements.txt"))
  cpu_image = { ami = terraform_data.al2023.output, python = "python3.11", image_torch = false }
  graph_image = local.gpu_image ? {
    ami = var.graph_server_ami, python = var.graph_server_image_python, image_torch = true
  } : local.cpu_image
  servers = merge(
    { for i, ip in local.graph_server_ips : "graph-server-${i}" => merge(local.graph_image, {
      role = "graph-server", rank = i, ip = ip, type = var.graph_server_type, disk_gb = local.gpu_image ? 200 : 100
    }) },
    { for i, ip in local.weight_server_ips : "weight-server-${i}" => merge(local.cpu_image, {
      role = "weight-server", rank = i, ip = ip, type = var.weight_server_type, disk_gb = 30
    }) },
  )
  # the lock without its CPU torch, for a server that keeps its image's CUDA build
  lock_without_torch = join("\n", [for line in split("\n", local.lock) : line if !startswith(line, "torch==")])
  # destroy and a targeted apply run without the wheel (server_wheel = ""): nothing below reads the file then
  wheel_sha256 = var.server_wheel == "" ? "" : filesha256(var.server_wheel)
}

resource "aws_s3_object" "server_wheel" {
  bucket      = aws_s3_bucket.data.id
  key         = "packages/${basename(var.server_wheel)}"
  source      = var.server_wheel
  source_hash = local.wheel_sha256 # a rebuilt wheel is uploaded again (and the servers replaced: their user data names it)
  kms_key_id  = aws_kms_key.data.arn
  lifecycle {
    precondition {
      condition     = var.server_wheel != ""
      error_message = "server_wheel: give the wheel the servers install, -var server_wheel=$(ls ../dist/dorylus_py-*.whl) (pip wheel --no-deps -w dist . first)."
    }
  }
}

resource "aws_instance" "server" {
  # checkov:skip=CKV_AWS_126: detailed monitoring is billed per instance; dorylus records its own timings
  # checkov:skip=CKV2_AWS_41: the instance profile is attached (aws_iam_instance_profile.server)
  # checkov:skip=CKV_AWS_88: a public address instead of a NAT gateway (about 32 USD a month plus data) for pip at
  #   boot and operator SSH; the security group admits only operator_cidr, the Lambdas and the servers
  for_each                    = local.servers
  ami                         = each.value.ami
  instance_type               = each.value.type
  subnet_id                   = aws_subnet.servers.id
  private_ip                  = each.value.ip
  associate_public_ip_address = true
  vpc_security_group_ids      = [aws_security_group.servers.id]
  iam_instance_profile        = aws_iam_instance_profile.server.name
  key_name                    = var.key_name == "" ? null : var.key_name
  ebs_optimized               = true
  user_data_replace_on_change = true
  user_data = templatefile("${path.module}/templates/server.sh.tftpl", {
    role         = each.value.role, rank = each.value.rank, cluster_json = jsonencode(local.cluster), region = var.region,
    bucket       = aws_s3_bucket.data.bucket, wheel_key = aws_s3_object.server_wheel.key,
    wheel_file   = basename(var.server_wheel), wheel_sha256 = local.wheel_sha256,
    python       = each.value.python, image_torch = each.value.image_torch,
    requirements = each.value.image_torch ? local.lock_without_torch : local.lock
  })
  lifecycle {
    precondition {
      condition     = var.operator_cidr != ""
      error_message = "operator_cidr: give your address, -var operator_cidr=$(curl -s https://checkip.amazonaws.com)/32 (the only network SSH is open to)."
    }
  }
  metadata_options {
    http_tokens   = "required" # IMDSv2 only
    http_endpoint = "enabled"
  }
  root_block_device {
    volume_size = each.value.disk_gb
    encrypted   = true
  }
  tags = { Name = "${var.name}-${each.key}" }
}
