"""What a user runs to deploy on AWS besides Terraform: the Lambda image's build context, the cluster
file from Terraform's outputs (addresses, the function, and the name of the job key's secret, never a
secret itself), and pointing the function at a newly pushed image."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from dorylus_py.atomic import atomic_dir, atomic_file, check_replaceable
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jsonfile import read_json

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "lambda_functions" / "handler.py"  # the image's CMD: lambda_functions.handler.handler


def import_closure(entry: Path, root: Path = REPO, packages: tuple[str, ...] = ("dorylus_py", "lambda_functions")) -> list[Path]:
    """Every source file of ``packages`` that ``entry`` can import, directly or not, read from the
    sources (every ``import`` statement, a deferred one inside a function too, so the set can only be
    too large, never too small), with the ``__init__.py`` of each package on the way."""
    seen, todo = set(), [entry.resolve()]
    todo += [d / "__init__.py" for d in entry.resolve().parents if root.resolve() in d.parents and (d / "__init__.py").is_file()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_names(path):
            parts = name.split(".")
            if parts[0] not in packages:
                continue
            for i in range(1, len(parts) + 1):  # each package on the way, and the module itself
                base = root.joinpath(*parts[:i])
                for candidate in (base / "__init__.py", base.with_suffix(".py")):
                    if candidate.is_file() and candidate.resolve() not in seen:
                        todo.append(candidate.resolve())
    return sorted(seen)


def _imported_names(path: Path) -> list[str]:
    """The modules (and, for ``from m import x``, ``m.x``, which may be a module) ``path`` imports."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def build_context(out: Path, overwrite: bool = False) -> list[Path]:
    """Lay out ``docker build`` input in ``out``: the Dockerfile, the handler, the modules it imports.
    ``overwrite``: replace an earlier build context there (and nothing else: a folder holding other
    files is refused)."""
    dockerfile = REPO / "lambda_functions" / "Dockerfile"
    if not dockerfile.exists() or not ENTRY.exists():
        raise ConfigError(f"build-context needs a source checkout; missing {dockerfile if not dockerfile.exists() else ENTRY}")
    sources = [dockerfile] + import_closure(ENTRY)
    layout = {src: Path("Dockerfile") if src.name == "Dockerfile" else src.relative_to(REPO) for src in sources}
    names = {str(rel) for rel in layout.values()}
    check_replaceable(out, names, overwrite, "a Lambda build context")
    try:  # docs/aws.md's `build-context build/lambda` in a fresh clone, which has no build/ yet
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out.parent}: cannot make the folder ({e.strerror})") from None
    written = []
    with atomic_dir(out, names) as staging:
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
    from dorylus_py.serving.cluster_spec import ClusterSpec

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
