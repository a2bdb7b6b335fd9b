# `terraform output -json > tf.json; dorylus aws cluster-file --terraform-output tf.json --out cluster.json`

output "cluster" {
  description = "The cluster file's contents: driver, graph_servers, weight_servers, lambda_function, region"
  value       = local.cluster
}

output "job_key_secret" {
  description = "ARN of the job key's secret (no value: store one with `dorylus aws put-secret --secret-id ARN`)"
  value       = aws_secretsmanager_secret.job_key.arn
}

output "bucket" {
  description = "Bucket for prepared datasets"
  value       = aws_s3_bucket.data.bucket
}

output "dataset_uri" {
  description = "Prefix to prepare datasets into (dorylus prepare ... --out DATASET_URI/NAME)"
  value       = "s3://${aws_s3_bucket.data.bucket}/${var.dataset_prefix}"
}

output "graph_server_public_ips" {
  description = "SSH to graph server 0 to run the driver"
  value       = [for i in range(var.graph_server_count) : aws_instance.server["graph-server-${i}"].public_ip]
}

output "graph_server_instance_ids" {
  description = "Instance ids of the graph servers (aws ec2-instance-connect send-ssh-public-key --instance-id)"
  value       = [for i in range(var.graph_server_count) : aws_instance.server["graph-server-${i}"].id]
}

output "servers" {
  description = "Every server by name: its instance id and public address (restarting them all: docs/aws.md)"
  value = { for name, instance in aws_instance.server : name => {
    id = instance.id, public_ip = instance.public_ip, private_ip = instance.private_ip
  } }
}

output "lambda_function" {
  description = "Tensor worker function name"
  value       = aws_lambda_function.tensor.function_name
}
