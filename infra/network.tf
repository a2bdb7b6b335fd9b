# One VPC: servers in a public subnet (they pip-install at boot and are reached by SSH from the
# operator only), Lambdas in private subnets with no route out: they only talk to the servers.

data "aws_availability_zones" "available" {
  # checkov:skip=CKV_AWS_394: zones are chosen by what they offer (below); a zone AWS adds later changes nothing here
  state            = "available"
  exclude_zone_ids = var.excluded_zone_ids # zones Lambda does not run VPC functions in
  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"] # no Local Zones or opt-in regions' zones
  }
}

data "aws_ec2_instance_type_offerings" "servers" {
  location_type = "availability-zone"
  filter {
    name   = "instance-type"
    values = local.server_types
  }
}

# Zones by what they offer, not by their order: the servers' zone offers every server type; the Lambdas
# run there too (their traffic with the servers stays in the zone, free) and, with lambda_zone_count = 2,
# in one more zone, in case one has no capacity (those Lambdas' traffic crosses zones: 0.01 USD/GB each
# way, docs/aws.md).
locals {
  server_types = distinct([var.graph_server_type, var.weight_server_type])
  offered      = data.aws_ec2_instance_type_offerings.servers
  offers = { for t in local.server_types : t => [
    for i, zone in local.offered.locations : zone if local.offered.instance_types[i] == t
  ] }
  server_zones = [for z in data.aws_availability_zones.available.names : z
  if alltrue([for t in local.server_types : contains(local.offers[t], z)])]
  server_zone  = try(local.server_zones[0], "")
  lambda_zones = concat([local.server_zone], [for z in data.aws_availability_zones.available.names : z if z != local.server_zone])
}

resource "aws_vpc" "main" {
  # checkov:skip=CKV2_AWS_11: flow logs are billed per GB; turn them on for long-lived production VPCs
  # checkov:skip=CKV2_AWS_12: nothing is placed in the default group (every resource names its own); emptying it
  #   means tagging and changing a group Terraform did not create, which the operator's policy does not allow
  cidr_block           = "10.42.0.0/16"
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = "${var.name}-vpc" }
}

resource "aws_internet_gateway" "main" {
  vpc_id = aws_vpc.main.id
}

resource "aws_subnet" "servers" {
  vpc_id            = aws_vpc.main.id
  cidr_block        = "10.42.0.0/24"
  availability_zone = local.server_zone
  tags              = { Name = "${var.name}-servers" }
  lifecycle {
    precondition {
      condition     = local.server_zone != ""
      error_message = "No zone of this region (less excluded_zone_ids) offers every server type (graph_server_type, weight_server_type): choose types or a region that does (aws ec2 describe-instance-type-offerings --location-type availability-zone)."
    }
  }
}

resource "aws_subnet" "lambda" {
  count             = var.lambda_zone_count
  vpc_id            = aws_vpc.main.id
  cidr_block        = "10.42.${count.index + 1}.0/24"
  availability_zone = local.lambda_zones[count.index]
  tags              = { Name = "${var.name}-lambda-${count.index}" }
}

resource "aws_route_table" "servers" {
  vpc_id = aws_vpc.main.id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.main.id
  }
}

resource "aws_route_table_association" "servers" {
  subnet_id      = aws_subnet.servers.id
  route_table_id = aws_route_table.servers.id
}

resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.main.id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.servers.id]
}

# Fixed private addresses, so every server's boot script can write the whole cluster file.
locals {
  graph_server_ips  = [for i in range(var.graph_server_count) : cidrhost(aws_subnet.servers.cidr_block, 10 + i)]
  weight_server_ips = [for i in range(var.weight_server_count) : cidrhost(aws_subnet.servers.cidr_block, 200 + i)]
  cluster = {
    driver          = "tcp://${local.graph_server_ips[0]}:${var.driver_port}"
    graph_servers   = [for ip in local.graph_server_ips : "tcp://${ip}:${var.graph_server_port}"]
    weight_servers  = [for ip in local.weight_server_ips : "tcp://${ip}:${var.weight_server_port}"]
    lambda_function = aws_lambda_function.tensor.function_name
    region          = var.region
    key_secret      = aws_secretsmanager_secret.job_key.arn # where every process reads the job key at start
  }
}
