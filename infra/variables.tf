variable "region" {
  description = "AWS region for everything"
  type        = string
  default     = "us-east-1"
}

variable "name" {
  description = "Prefix of every resource name"
  type        = string
  default     = "dorylus"
}

variable "operator_cidr" {
  description = "The only network allowed to SSH to the servers (your address, e.g. 203.0.113.7/32); needed to make them, not to destroy"
  type        = string
  default     = ""
  validation {
    condition     = var.operator_cidr == "" || (can(cidrhost(var.operator_cidr, 0)) && var.operator_cidr != "0.0.0.0/0")
    error_message = "operator_cidr must be a CIDR block narrower than the whole internet."
  }
}

variable "operator_arns" {
  description = "IAM users or roles (ARNs) that may use, change and retire the deployment's KMS key, which its own policy grants them (the operator's IAM policy grants no KMS key): empty, whoever runs the first apply"
  type        = list(string)
  default     = []
}

variable "key_name" {
  description = "An EC2 key pair of yours for SSH (empty: none; log in with EC2 Instance Connect, which pushes a key for 60 s: docs/aws.md)"
  type        = string
  default     = ""
}

variable "graph_server_count" {
  description = "Graph servers = partitions of the prepared dataset"
  type        = number
  default     = 2
}

variable "graph_server_type" {
  description = "EC2 instance type of the graph servers (a GPU type, e.g. g5.xlarge, with graph_server_ami for --backend gpu)"
  type        = string
  default     = "c5n.2xlarge"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.graph_server_type))
    error_message = "graph_server_type must be an EC2 instance type, such as c5n.2xlarge or g5.xlarge."
  }
}

variable "graph_server_ami" {
  description = <<-EOT
    AMI of the graph servers. Empty: Amazon Linux 2023 with the lock's CPU torch. For --backend gpu: an
    Amazon Linux 2023 image with NVIDIA's driver and a CUDA build of torch for Python 3.11, such as AWS's
    "Deep Learning OSS Nvidia Driver AMI GPU PyTorch" for Amazon Linux 2023; the servers then use that
    torch (graph_server_image_python) instead of installing the CPU build over it.
  EOT
  type        = string
  default     = ""
  validation {
    condition     = var.graph_server_ami == "" || can(regex("^ami-([0-9a-f]{8}|[0-9a-f]{17})$", var.graph_server_ami))
    error_message = "graph_server_ami must be empty (Amazon Linux 2023, CPU torch) or an AMI id: ami- and 8 or 17 hex digits."
  }
}

variable "graph_server_image_python" {
  description = "With graph_server_ami: the image's Python 3.11 that imports its CUDA torch (the Deep Learning AMI's PyTorch environment by default); the boot stops if it is not that"
  type        = string
  default     = "/opt/pytorch/bin/python3"
  validation {
    condition     = can(regex("^/[A-Za-z0-9._/+-]+$", var.graph_server_image_python))
    error_message = "graph_server_image_python must be an absolute path (letters, digits, . _ / + -)."
  }
}

variable "weight_server_count" {
  description = "Weight servers (layer l lives on server l mod count)"
  type        = number
  default     = 1
}

variable "weight_server_type" {
  description = "EC2 instance type of the weight servers"
  type        = string
  default     = "c5.xlarge"
}

variable "graph_server_port" {
  description = "Port every graph server listens on"
  type        = number
  default     = 7100
}

variable "weight_server_port" {
  description = "Port every weight server listens on"
  type        = number
  default     = 7200
}

variable "driver_port" {
  description = "Port of the driver (dorylus train --cluster), run on graph server 0"
  type        = number
  default     = 7000
}

variable "lambda_image_uri" {
  description = "ECR image the tensor worker is made from (docs/aws.md: dorylus aws build-context, docker build, push); later images go live with `dorylus aws update-function`, which Terraform leaves alone; needed to make it, not to destroy"
  type        = string
  default     = ""
}

variable "lambda_memory_mb" {
  description = "Memory of each Lambda (CPU share grows with it)"
  type        = number
  default     = 3008
}

variable "lambda_timeout_s" {
  description = "A Lambda's time limit in seconds"
  type        = number
  default     = 60
}

variable "lambda_zone_count" {
  description = "Zones the Lambdas run in: 1, the servers' zone (their traffic with the servers is free); 2 adds another zone, in case the first has no capacity, whose Lambdas' traffic crosses zones at 0.01 USD per GB each way"
  type        = number
  default     = 1
  validation {
    condition     = contains([1, 2], var.lambda_zone_count)
    error_message = "lambda_zone_count must be 1 (the servers' zone) or 2 (and one more)."
  }
}

variable "lambda_reserved_concurrency" {
  description = <<-EOT
    Concurrency reserved for the function (null: none, it shares the account's pool). AWS keeps 100 of an
    account's concurrency unreserved, so reserving N needs a quota of N + 100; new accounts often start
    with 10 (Service Quotas, AWS Lambda, "Concurrent executions"). Reserving guarantees --lambdas and caps them.
  EOT
  type        = number
  default     = null
  validation {
    condition     = var.lambda_reserved_concurrency == null ? true : var.lambda_reserved_concurrency >= 1
    error_message = "lambda_reserved_concurrency must be null (no reservation) or at least 1."
  }
}

variable "server_wheel" {
  description = "The dorylus-py wheel the servers install (pip wheel --no-deps -w dist . in a checkout); uploaded to the bucket, its SHA-256 checked by pip on every server; needed by every apply but a targeted one (-target), not by destroy"
  type        = string
  default     = ""
  validation {
    condition     = var.server_wheel == "" || (endswith(var.server_wheel, ".whl") && can(filesha256(var.server_wheel)))
    error_message = "server_wheel must be the path of a built wheel (.whl): pip wheel --no-deps -w dist . (docs/aws.md)."
  }
}

variable "dataset_prefix" {
  description = "Key prefix of prepared datasets (dorylus prepare --out s3://BUCKET/PREFIX/NAME)"
  type        = string
  default     = "datasets"
}

variable "checkpoint_prefix" {
  description = "Key prefix of checkpoints (dorylus train --checkpoint-dir s3://BUCKET/PREFIX/RUN): the only place the servers' role may write"
  type        = string
  default     = "checkpoints"
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete the bucket with every dataset in it (default: refuse while it holds objects)"
  type        = bool
  default     = false
}

variable "log_retention_days" {
  description = "Days the Lambda's CloudWatch logs are kept"
  type        = number
  default     = 14
}

variable "excluded_zone_ids" {
  description = "Availability Zone IDs not to use (zone IDs, the same in every account): Lambda does not run VPC functions in use1-az3; add any zone that refuses a subnet or an instance type"
  type        = list(string)
  default     = ["use1-az3"]
}
