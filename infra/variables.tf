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
  description = "The only network allowed to SSH to the servers (your address, e.g. 203.0.113.7/32)"
  type        = string
  validation {
    condition     = can(cidrhost(var.operator_cidr, 0)) && var.operator_cidr != "0.0.0.0/0"
    error_message = "operator_cidr must be a CIDR block narrower than the whole internet."
  }
}

variable "key_name" {
  description = "EC2 key pair for SSH (empty: no key; use SSM Session Manager)"
  type        = string
  default     = ""
}

variable "graph_server_count" {
  description = "Graph servers = partitions of the prepared dataset"
  type        = number
  default     = 2
}

variable "graph_server_type" {
  description = "EC2 instance type of the graph servers"
  type        = string
  default     = "c5n.2xlarge"
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
  description = "ECR image of the tensor worker (see docs/aws.md: dorylus aws build-context, docker build, push)"
  type        = string
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

variable "lambda_reserved_concurrency" {
  description = "Lambdas that may run at once (reserved for this function)"
  type        = number
  default     = 100
}

variable "package_spec" {
  description = "What the servers pip-install (a version from PyPI or a git URL)"
  type        = string
  default     = "dorylus-py[aws]==0.1.0"
}

variable "dataset_prefix" {
  description = "Key prefix of prepared datasets (dorylus prepare --out s3://BUCKET/PREFIX/NAME)"
  type        = string
  default     = "datasets"
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
