"""The AWS path rehearsed on this machine (``dorylus aws rehearse``): a moto server that enforces IAM,
``terraform apply`` of infra/ against it, the servers as their boot script starts them, a training job
through the Lambda API, ``terraform destroy``; see docs/aws.md."""
