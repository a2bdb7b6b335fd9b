"""`dorylus aws`: the Lambda image's build context, the cluster file from Terraform, function updates, and
the whole path rehearsed on this machine."""

from __future__ import annotations

from pathlib import Path

from dorylus_py.cli_parser import command
from dorylus_py.keygen import add_put_secret_command


def add_aws(sub) -> None:
    p = command(sub, "aws", "deploy on AWS: the Lambda image's build context, the cluster file from Terraform's "
                 "outputs, updating the function's image (see docs/aws.md)")
    aws = p.add_subparsers(title="aws commands", metavar="AWS_COMMAND", required=True)
    b = command(aws, "build-context", "lay out what `docker build` needs for the Lambda image: Dockerfile, the "
                 "handler and the modules it imports")
    b.add_argument("dir", metavar="DIR", help="output folder (replaced with --overwrite)")
    b.add_argument("--overwrite", action="store_true", help="replace DIR if it is not empty")
    b.set_defaults(run=_run_build_context)
    c = command(aws, "cluster-file", "write the cluster file the servers and the driver read, from `terraform output -json`")
    c.add_argument("--terraform-output", required=True, metavar="TF.json", help="`terraform output -json` of infra/")
    c.add_argument("--out", required=True, metavar="CLUSTER.json", help="cluster file to write")
    c.set_defaults(run=_run_cluster_file)
    u = command(aws, "update-function", "point the Lambda function at a newly pushed image and wait until it is live")
    u.add_argument("--function", required=True, help="function name or ARN (Terraform output lambda_function)")
    u.add_argument("--image-uri", required=True, help="ECR image URI, e.g. ACCOUNT.dkr.ecr.REGION.amazonaws.com/dorylus-lambda:TAG")
    u.add_argument("--region", default="", help="AWS region (default: from the AWS environment)")
    u.add_argument("--profile", default="", help="AWS credentials profile (default: from the AWS environment)")
    u.set_defaults(run=_run_update_function)
    add_put_secret_command(aws, command)
    r = command(aws, "rehearse", "rehearse docs/aws.md on this machine, no account needed: its commands against moto "
                "with IAM enforced (sections 1 and 5 as written), terraform apply of infra/, the servers as their boot "
                "script starts them, two training jobs whose Lambdas run as the image runs them (awslambdaric), "
                "destroy (needs a source checkout, terraform, the AWS CLI, the hashicorp/aws provider for offline use "
                "and the dev extra: moto[server], awslambdaric; about 3 to 5 minutes)")
    r.add_argument("--work", default="", metavar="DIR", help="folder for its files and logs (default: a temporary "
                   "folder, removed after a successful rehearsal)")
    r.add_argument("--plugin-dir", default="", metavar="DIR", help="a provider mirror holding "
                   "registry.terraform.io/hashicorp/aws (default: $DORYLUS_TF_PLUGIN_DIR or a usual place)")
    r.add_argument("--epochs", type=int, default=3, help="epochs of each job (default 3)")
    r.set_defaults(run=_run_rehearse)


def _run_build_context(args) -> int:
    from dorylus_py.deploy import build_context

    files = build_context(Path(args.dir), args.overwrite)
    print(f"wrote {len(files)} files to {args.dir}; next: docker build -t dorylus-lambda {args.dir} (see docs/aws.md)")
    return 0


def _run_cluster_file(args) -> int:
    from dorylus_py.deploy import write_cluster_file

    c = write_cluster_file(Path(args.terraform_output), Path(args.out))
    print(f"wrote {args.out}: driver {c['driver']}, {len(c['graph_servers'])} graph servers, "
          f"{len(c['weight_servers'])} weight servers, function {c['lambda_function']} in {c['region']}")
    return 0


def _run_update_function(args) -> int:
    from dorylus_py.deploy import update_function_image

    sha = update_function_image(args.function, args.image_uri, args.region, args.profile)
    print(f"{args.function} now runs {args.image_uri} (code sha256 {sha})")
    return 0


def _run_rehearse(args) -> int:
    import shutil
    import tempfile

    from dorylus_py.errors import ConfigError
    from dorylus_py.rehearsal.run import Rehearsal

    if args.epochs < 1:
        raise ConfigError(f"--epochs must be at least 1, got {args.epochs}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="dorylus-rehearsal-"))
    if args.work and work.exists() and any(work.iterdir()):
        raise ConfigError(f"{work}: exists and is not empty")
    try:
        result = Rehearsal(work, args.plugin_dir, args.epochs).run()
    except BaseException:
        print(f"logs and files of the rehearsal: {work}")
        raise
    print(f"rehearsed in {result['seconds']:.0f} s: {result['jobs']} jobs on the same servers, per-epoch losses "
          f"{[round(x, 6) for x in result['losses']]} as --backend local; {result['calls']} AWS calls, each allowed by "
          "its policy and every permission used or explained; terraform destroy left nothing")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0
