# `terraform output -json > tf.json; dorylus aws cluster-file --terraform-output tf.json --out cluster.json`

output "cluster" {
  description = "The cluster file's contents: driver, graph_servers, weight_servers, lambda_function, region"
  value       = local.cluster
}

output "job_token" {
  description = "The shared job token: export DORYLUS_TOKEN=... where the driver runs"
  value       = random_password.job_token.result
  sensitive   = true
}

output "bucket" {
  description = "Bucket for datasets and checkpoints"
  value       = aws_s3_bucket.data.bucket
}

output "dataset_uri" {
  description = "Prefix to prepare datasets into (dorylus prepare ... --out DATASET_URI/NAME)"
  value       = "s3://${aws_s3_bucket.data.bucket}/${var.dataset_prefix}"
}

output "checkpoint_uri" {
  description = "Prefix checkpoints go to"
  value       = "s3://${aws_s3_bucket.data.bucket}/${var.checkpoint_prefix}"
}

output "graph_server_public_ips" {
  description = "SSH to graph server 0 to run the driver"
  value       = [for i in range(var.graph_server_count) : aws_instance.server["graph-server-${i}"].public_ip]
}

output "lambda_function" {
  description = "Tensor worker function name"
  value       = aws_lambda_function.tensor.function_name
}
