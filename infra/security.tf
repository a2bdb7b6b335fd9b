# Server ports are open only to the Lambdas and to the servers themselves; SSH only to the operator.

resource "aws_security_group" "lambda" {
  name        = "${var.name}-lambda"
  description = "Tensor workers: no ingress; egress only to the servers' ports"
  vpc_id      = aws_vpc.main.id
}

resource "aws_security_group" "servers" {
  name        = "${var.name}-servers"
  description = "Graph and weight servers and the driver"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_egress_rule" "lambda_to_graph_servers" {
  security_group_id            = aws_security_group.lambda.id
  description                  = "Lambdas pull rows from and push results to the graph servers"
  referenced_security_group_id = aws_security_group.servers.id
  ip_protocol                  = "tcp"
  from_port                    = var.graph_server_port
  to_port                      = var.graph_server_port
}

resource "aws_vpc_security_group_egress_rule" "lambda_to_weight_servers" {
  security_group_id            = aws_security_group.lambda.id
  description                  = "Lambdas pull weights from and push gradients to the weight servers"
  referenced_security_group_id = aws_security_group.servers.id
  ip_protocol                  = "tcp"
  from_port                    = var.weight_server_port
  to_port                      = var.weight_server_port
}

resource "aws_vpc_security_group_ingress_rule" "graph_servers_from_lambda" {
  security_group_id            = aws_security_group.servers.id
  description                  = "Graph server port, from the Lambdas"
  referenced_security_group_id = aws_security_group.lambda.id
  ip_protocol                  = "tcp"
  from_port                    = var.graph_server_port
  to_port                      = var.graph_server_port
}

resource "aws_vpc_security_group_ingress_rule" "weight_servers_from_lambda" {
  security_group_id            = aws_security_group.servers.id
  description                  = "Weight server port, from the Lambdas"
  referenced_security_group_id = aws_security_group.lambda.id
  ip_protocol                  = "tcp"
  from_port                    = var.weight_server_port
  to_port                      = var.weight_server_port
}

resource "aws_vpc_security_group_ingress_rule" "graph_servers_from_servers" {
  security_group_id            = aws_security_group.servers.id
  description                  = "Graph server port, from peer graph servers and the driver"
  referenced_security_group_id = aws_security_group.servers.id
  ip_protocol                  = "tcp"
  from_port                    = var.graph_server_port
  to_port                      = var.graph_server_port
}

resource "aws_vpc_security_group_ingress_rule" "weight_servers_from_servers" {
  security_group_id            = aws_security_group.servers.id
  description                  = "Weight server port, from the graph servers and the driver"
  referenced_security_group_id = aws_security_group.servers.id
  ip_protocol                  = "tcp"
  from_port                    = var.weight_server_port
  to_port                      = var.weight_server_port
}

resource "aws_vpc_security_group_ingress_rule" "driver_from_servers" {
  security_group_id            = aws_security_group.servers.id
  description                  = "Driver port, from the servers"
  referenced_security_group_id = aws_security_group.servers.id
  ip_protocol                  = "tcp"
  from_port                    = var.driver_port
  to_port                      = var.driver_port
}

resource "aws_vpc_security_group_ingress_rule" "ssh_from_operator" {
  count             = var.operator_cidr == "" ? 0 : 1 # given to every apply that makes the servers (their precondition)
  security_group_id = aws_security_group.servers.id
  description       = "SSH from the operator's network only"
  cidr_ipv4         = var.operator_cidr
  ip_protocol       = "tcp"
  from_port         = 22
  to_port           = 22
}

resource "aws_vpc_security_group_egress_rule" "servers_out" {
  security_group_id = aws_security_group.servers.id
  description       = "pip install at boot, S3, Lambda Invoke API, and the peers"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}
