"""What a user runs to deploy on AWS besides Terraform: the Lambda image's build context, the cluster
file from Terraform's outputs (addresses, the function, and the name of the job key's secret, never a
secret itself), and pointing the function at a newly pushed image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dorylus_py.atomic import atomic_dir, atomic_file, check_replaceable
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jsonfile import read_json

REPO = Path(__file__).resolve().parents[1]
# The handler imports these and nothing else of the package (tests/aws/test_deploy.py checks it).
HANDLER_MODULES = ["__init__.py", "errors.py", "jobkey.py", "kernels/__init__.py", "kernels/attention.py",
                   "kernels/dropout.py", "kernels/gat_ops.py", "kernels/gcn_ops.py", "kernels/sage_ops.py",
                   "kernels/sparse.py", "kernels/tasks.py", "models/__init__.py", "models/architectures.py",
                   "models/spec.py", "pipeline/__init__.py", "pipeline/events.py", "pipeline/stages.py",
                   "pipeline/tasks.py", "protocol/__init__.py", "protocol/bounded_json.py", "protocol/messages.py",
                   "protocol/replay.py", "protocol/session.py", "protocol/transport.py", "protocol/zap.py",
                   "weights/__init__.py", "weights/adam.py", "weights/blocks.py", "weights/store.py"]


def build_context(out: Path, overwrite: bool = False) -> list[Path]:
    """Lay out ``docker build`` input in ``out``: the Dockerfile, the handler, the modules it imports.
    ``overwrite``: replace an earlier build context there (and nothing else: a folder holding other
    files is refused)."""
    handler = [REPO / "lambda_functions" / name
               for name in ("Dockerfile", "__init__.py", "channel.py", "handler.py", "link.py", "row_cache.py", "stream.py")]
    sources = handler + [REPO / "dorylus_py" / m for m in HANDLER_MODULES]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise ConfigError(f"build-context needs a source checkout; missing {missing[0]}")
    layout = {src: Path("Dockerfile") if src.name == "Dockerfile" else src.relative_to(REPO) for src in sources}
    check_replaceable(out, {str(rel) for rel in layout.values()}, overwrite, "a Lambda build context")
    if not out.parent.exists():
        raise ConfigError(f"{out.parent}: folder does not exist")
    written = []
    with atomic_dir(out, overwrite=True) as staging:
        for src, rel in layout.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, staging / rel)
            written.append(out / rel)
    return written


def cluster_from_terraform(tf_output: Path) -> dict:
    """The cluster file's contents from ``terraform output -json`` (its ``cluster`` output)."""
    raw = read_json(tf_output, DataError, "not found (terraform output -json > FILE)")
    if not isinstance(raw, dict) or "cluster" not in raw or not isinstance(raw["cluster"], dict):
        raise DataError(f"{tf_output}: no 'cluster' output; is this `terraform output -json` of infra/?")
    cluster = raw["cluster"].get("value")
    need = ("driver", "graph_servers", "weight_servers", "lambda_function", "region", "key_secret")
    if not isinstance(cluster, dict) or any(k not in cluster for k in need):
        raise DataError(f"{tf_output}: output 'cluster' lacks one of {', '.join(need)}")
    return {k: cluster[k] for k in need}


def write_cluster_file(tf_output: Path, out: Path) -> dict:
    from dorylus_py.cluster.spec import ClusterSpec

    cluster = cluster_from_terraform(tf_output)
    with atomic_file(out) as tmp:
        tmp.write_text(json.dumps(cluster, indent=2) + "\n")
        ClusterSpec.load(tmp)  # the same checks the servers apply; nothing is left on failure
    return cluster


def update_function_image(function: str, image_uri: str, region: str | None = None, profile: str | None = None) -> str:
    """Point ``function`` at ``image_uri`` and wait until the update is live; return the new code SHA."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, WaiterError

    client = boto3.Session(profile_name=profile or None, region_name=region or None).client("lambda")
    try:
        resp = client.update_function_code(FunctionName=function, ImageUri=image_uri)
        client.get_waiter("function_updated_v2").wait(FunctionName=function, WaiterConfig={"Delay": 2, "MaxAttempts": 150})
    except (ClientError, BotoCoreError, WaiterError) as e:
        raise ConfigError(f"updating {function}: {e}") from None
    return resp.get("CodeSha256", "")
