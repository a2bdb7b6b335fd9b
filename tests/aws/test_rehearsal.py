"""`dorylus aws rehearse`: docs/aws.md from `terraform apply` to two trained models and back to nothing,
against moto with IAM enforced (dorylus_py/rehearsal/). It runs wherever the suite runs: without
terraform or the provider mirror it fails naming what is missing (DORYLUS_SKIP_REHEARSAL=1 skips it
by hand). About 3-4 minutes on 2 cores; its own checks (losses, leftovers, calls, docs) raise."""

from __future__ import annotations

import json
import os

import pytest

from dorylus_py.cli import main


@pytest.fixture()
def rehearsal_tools():
    if os.environ.get("DORYLUS_SKIP_REHEARSAL") == "1":
        pytest.skip("DORYLUS_SKIP_REHEARSAL=1")
    from dorylus_py.errors import ConfigError
    from dorylus_py.rehearsal.terraform import find_tools

    try:
        return find_tools()
    except ConfigError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.mark.timeout(1500)  # 3.5 min alone, over 6 under load
def test_rehearsal_from_terraform_apply_to_trained_models_and_back_to_nothing(rehearsal_tools, tmp_path, monkeypatch):
    from dorylus_py.rehearsal.run import STEPS, Rehearsal

    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)  # the rehearsal hands each identity its own credentials
    result = Rehearsal(tmp_path / "r", epochs=2, say=print).run()  # each step and its time, under pytest -s
    assert tuple(step for step, _ in result["steps"] if not step.startswith("(")) == STEPS
    assert result["jobs"] == 2 and len(result["losses"]) == 2  # both equal --backend local's (checked inside)
    # every server came up before the job key was there, exited, and was started again by its unit
    assert sorted(result["exits"]) == ["graph-server-0", "graph-server-1", "weight-server-0"]
    assert all(exits[0] == 2 for exits in result["exits"].values()), result["exits"]
    calls = [json.loads(line) for line in (tmp_path / "r" / "calls.jsonl").read_text().splitlines()]
    server = {(c["action"], c["resource"].split(":::")[-1].split("/")[1] if ":::" in c["resource"] else "")
              for c in calls if c["who"] == "server"}
    assert ("s3:PutObject", "checkpoints") in server and ("lambda:GetFunctionConfiguration", "") in server
    assert ("s3:GetObject", "packages") in server and ("lambda:InvokeFunction", "") in server
    assert all(c["allowed"] for c in calls if c["who"] != "harness")
    print(f"rehearsal: {result['seconds']} s; " + "; ".join(f"{s} {t} s" for s, t in result["steps"]))


def test_rehearse_refuses_a_work_folder_that_holds_files(tmp_path, capsys):
    (tmp_path / "x").write_text("")
    assert main(["aws", "rehearse", "--work", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not empty" in err and "Traceback" not in err
    assert main(["aws", "rehearse", "--epochs", "0"]) == 2
