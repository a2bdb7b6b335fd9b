"""`dorylus aws build-context | cluster-file | update-function`."""

from __future__ import annotations

import json
import subprocess
import sys

import boto3

from dorylus_py.cli import main
from dorylus_py.serving.cluster_spec import ClusterSpec


def test_build_context_holds_everything_the_handler_imports(tmp_path):
    ctx = tmp_path / "ctx"
    assert main(["aws", "build-context", str(ctx)]) == 0
    dockerfile = (ctx / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM public.ecr.aws/lambda/provided:al2023" in dockerfile
    assert "torch==2.13.0" in dockerfile and 'CMD ["lambda_functions.handler.handler"]' in dockerfile
    # Import the handler from the context alone (first on the path, run from elsewhere): every
    # dorylus module it loads must come from the context.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import lambda_functions.handler as h; "
             "mods = [m for n, m in sys.modules.items() if n.split('.')[0] in ('dorylus_py', 'lambda_functions')]; "
             "bad = [m.__name__ for m in mods if not (getattr(m, '__file__', '') or '').startswith(sys.argv[1])]; "
             "assert callable(h.handler) and not bad, bad; print(len(mods))")
    proc = subprocess.run([sys.executable, "-c", probe, str(ctx)], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert main(["aws", "build-context", str(ctx)]) == 2  # not empty, no --overwrite
    assert main(["aws", "build-context", str(ctx), "--overwrite"]) == 0  # an earlier context: replaced
    (ctx / "extra").write_text("x")  # anything else: --overwrite replaces only what the command writes
    assert main(["aws", "build-context", str(ctx), "--overwrite"]) == 2 and (ctx / "extra").read_text() == "x"



def test_build_context_makes_its_parent_folders_as_in_a_fresh_clone(tmp_path, capsys):
    """docs/aws.md's `dorylus aws build-context build/lambda`, where build/ does not exist yet (issue 54)."""
    assert main(["aws", "build-context", str(tmp_path / "build" / "lambda")]) == 0
    assert (tmp_path / "build" / "lambda" / "Dockerfile").is_file()
    (tmp_path / "file").write_text("")
    capsys.readouterr()
    assert main(["aws", "build-context", str(tmp_path / "file" / "lambda")]) == 2  # a parent that is a file
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "file" in err and "Traceback" not in err

TF_OUTPUT = {
    "cluster": {"sensitive": False, "type": ["object", {}], "value": {
        "driver": "tcp://10.42.0.10:7000", "graph_servers": ["tcp://10.42.0.10:7100", "tcp://10.42.0.11:7100"],
        "weight_servers": ["tcp://10.42.0.200:7200"], "lambda_function": "dorylus-tensor", "region": "us-west-2",
        "key_secret": "arn:aws:secretsmanager:us-west-2:123456789012:secret:dorylus-job-key-AbC"}},
    "job_key_secret": {"sensitive": False, "type": "string",
                       "value": "arn:aws:secretsmanager:us-west-2:123456789012:secret:dorylus-job-key-AbC"},
    "bucket": {"sensitive": False, "type": "string", "value": "dorylus-data-1"},
}


def test_cluster_file_from_terraform_outputs(tmp_path, capsys):
    tf = tmp_path / "tf.json"
    tf.write_text(json.dumps(TF_OUTPUT))
    out = tmp_path / "cluster.json"
    assert main(["aws", "cluster-file", "--terraform-output", str(tf), "--out", str(out)]) == 0
    spec = ClusterSpec.load(out)
    assert spec.graph_servers == TF_OUTPUT["cluster"]["value"]["graph_servers"]
    assert spec.lambda_function == "dorylus-tensor" and spec.region == "us-west-2"
    assert spec.key_secret.endswith(":secret:dorylus-job-key-AbC")  # where processes read the key: a name only
    bad = dict(TF_OUTPUT, cluster={"value": dict(TF_OUTPUT["cluster"]["value"], driver="10.42.0.10")})
    tf.write_text(json.dumps(bad))
    out2 = tmp_path / "cluster2.json"
    capsys.readouterr()
    assert main(["aws", "cluster-file", "--terraform-output", str(tf), "--out", str(out2)]) == 2
    assert "not an address" in capsys.readouterr().err and not out2.exists()
    tf.write_text(json.dumps({"bucket": TF_OUTPUT["bucket"]}))
    assert main(["aws", "cluster-file", "--terraform-output", str(tf), "--out", str(out2)]) == 2


def test_update_function_image_against_moto(moto_url, capsys):
    role = boto3.client("iam").create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    lam = boto3.client("lambda")
    lam.create_function(FunctionName="dorylus-tensor", Role=role, PackageType="Image",
                        Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/dorylus-lambda:v1"})
    new = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dorylus-lambda:v2"
    assert main(["aws", "update-function", "--function", "dorylus-tensor", "--image-uri", new]) == 0
    assert lam.get_function(FunctionName="dorylus-tensor")["Code"]["ImageUri"] == new
    capsys.readouterr()
    assert main(["aws", "update-function", "--function", "nope", "--image-uri", new]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err
