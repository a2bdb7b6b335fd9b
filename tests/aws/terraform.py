"""infra/ parsed with python-hcl2, and its IAM policy documents rendered as the JSON AWS would get."""

from __future__ import annotations

import json
import re
from pathlib import Path

import hcl2

INFRA = Path(__file__).resolve().parents[2] / "infra"


def _clean(x):
    """python-hcl2 keeps HCL's quotes and adds markers; strip both."""
    if isinstance(x, dict):
        return {_clean(k): _clean(v) for k, v in x.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, str) and len(x) >= 2 and x[0] == x[-1] == '"':
        return x[1:-1]
    return x


def _one(x):
    """A nested block parses as a list of one."""
    return x[0] if isinstance(x, list) and len(x) == 1 else x


def blocks(kind: str) -> dict[tuple, dict]:
    """(type, name) -> body for every ``resource``/``data`` block; (name,) for variables and outputs."""
    out = {}
    for tf in sorted(INFRA.glob("*.tf")):
        parsed = _clean(hcl2.load(open(tf)))
        for entry in parsed.get(kind, []):
            for type_or_name, body in entry.items():
                if kind in ("variable", "output"):
                    out[(type_or_name,)] = body
                else:
                    for name, inner in body.items():
                        out[(type_or_name, name)] = inner
    return out


def text() -> str:
    return "\n".join(p.read_text() for p in sorted(INFRA.rglob("*")) if p.suffix in (".tf", ".tftpl"))


def statements() -> dict[str, list[dict]]:
    docs = {n: b for (t, n), b in blocks("data").items() if t == "aws_iam_policy_document"}
    return {n: (d["statement"] if isinstance(d["statement"], list) else [d["statement"]]) for n, d in docs.items()}


PLACEHOLDERS = {
    "${aws_cloudwatch_log_group.lambda.arn}": "arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/dorylus-tensor",
    "${aws_s3_bucket.data.arn}": "arn:aws:s3:::dorylus-data-x",
    "${aws_lambda_function.tensor.arn}": "arn:aws:lambda:us-east-1:123456789012:function:dorylus-tensor",
    "${var.dataset_prefix}": "datasets", "${var.region}": "us-east-1", "${var.checkpoint_prefix}": "checkpoints",
    "${aws_s3_object.server_wheel.key}": "packages/dorylus_py-0.1.0-py3-none-any.whl",
    "${aws_secretsmanager_secret.job_key.arn}": "arn:aws:secretsmanager:us-east-1:123456789012:secret:dorylus-job-key-AbCdEf",
    "${data.aws_caller_identity.current.account_id}": "123456789012",
    "${aws_iam_role.server.arn}": "arn:aws:iam::123456789012:role/dorylus-server",
    "${aws_iam_role.lambda.arn}": "arn:aws:iam::123456789012:role/dorylus-lambda",
}
# principals given as an expression (a list), as the first apply would render them
OPERATOR = "arn:aws:iam::123456789012:user/operator"
LISTS = {"${length(var.operator_arns) > 0 ? var.operator_arns : [data.aws_iam_session_context.operator.issuer_arn]}":
         [OPERATOR]}


def render(statements: list[dict], values: dict[str, str] | None = None) -> str:
    """The statements as the JSON AWS gets, Terraform's references replaced by PLACEHOLDERS (or ``values``)."""
    def sub(s: str) -> str:
        for k, v in (PLACEHOLDERS | (values or {})).items():
            s = s.replace(k, v)
        assert "${" not in s, s
        return s

    out = []
    for s in statements:
        st = {"Sid": s["sid"], "Effect": s.get("effect", "Allow"), "Action": s["actions"],
              "Resource": [sub(r) for r in s["resources"]]}
        if "condition" in s:
            c = _one(s["condition"])
            st["Condition"] = {c["test"]: {c["variable"]: [sub(v) for v in c["values"]]}}
        if "principals" in s:
            p = _one(s["principals"])
            names = LISTS[p["identifiers"]] if isinstance(p["identifiers"], str) else p["identifiers"]
            st["Principal"] = {p["type"]: [sub(n) for n in names]}
        out.append(st)
    return json.dumps({"Version": "2012-10-17", "Statement": out})


def user_data(role: str = "graph-server", rank: int = 0, **values) -> str:
    """The boot script as ``templatefile`` renders it (it uses plain ``${name}`` interpolations only)."""
    template = (INFRA / "templates" / "server.sh.tftpl").read_text()
    assert "%{" not in template, "the template grew directives: render it with terraform instead"
    values = {"role": role, "rank": rank, "cluster_json": "{}", "region": "us-east-1", "bucket": "dorylus-data-x",
              "wheel_key": "packages/dorylus_py-0.1.0-py3-none-any.whl", "wheel_file": "dorylus_py-0.1.0-py3-none-any.whl",
              "wheel_sha256": "0" * 64, "requirements": (INFRA / "server-requirements.txt").read_text().strip(),
              "python": "python3.11", "image_torch": "false"} | values
    return re.sub(r"\$\{(\w+)\}", lambda m: str(values[m.group(1)]), template)

