"""docs/aws.md is what a user types: its commands are the rehearsal's steps, in the same order (or named
with the reason they are not), the ones run on a server use what the boot script installed, and a command
run as written gets the shell variables the guide set before it."""

from __future__ import annotations

import re

from dorylus_py.rehearsal import guide
from dorylus_py.rehearsal.run import NOT_REHEARSED, STEPS, Rehearsal


def test_the_docs_commands_are_the_rehearsals_steps_in_order():
    rehearsed = [c for c in guide.every_command() if not c.startswith(tuple(NOT_REHEARSED))]
    steps = [next((s for s in STEPS if c.startswith(s)), f"not rehearsed: {c}") for c in rehearsed]
    assert steps == list(STEPS)


def test_the_rehearsal_applies_with_the_docs_variables():
    commands = guide.every_command()
    apply = next(c for c in commands if c.startswith("terraform apply"))
    assert set(re.findall(r"-var (\w+)=", apply)) == set(Rehearsal.VARIABLES)
    for later in ("terraform -chdir=infra apply", "terraform -chdir=infra destroy"):  # section 5: no wheel, no image
        command = next(c for c in commands if c.startswith(later))
        assert set(re.findall(r"-var (\w+)=", command)) <= {"region", "force_destroy"}, command


def test_commands_run_on_a_server_use_its_installed_dorylus_and_survive_ssh():
    """On a server, dorylus is in the boot script's venv, /opt/dorylus/bin, which is not on PATH; a job runs
    as a systemd unit of its own, so that a dropped SSH session does not stop it."""
    on_server = [c for b in guide.blocks("On graph server 0") for c in guide.commands(b)]
    runs = [c for c in on_server if re.search(r"\bdorylus (train|report)\b", c)]
    assert len(runs) >= 4 and all(re.search(r"(^|\s)/opt/dorylus/bin/dorylus (train|report)", c) for c in runs)
    trains = [c for c in runs if " train " in c]
    assert trains and all(c.startswith("sudo systemd-run --unit=") for c in trains)
    assert all("s3://$BUCKET/" in c for c in trains)  # the login profile's BUCKET, not a placeholder


def test_a_command_gets_the_assignments_it_uses_in_the_guides_order():
    before = ["ARN=$(aws iam create-policy ...)", "REGION=us-east-1", "ACCOUNT=$(aws sts get-caller-identity --region $REGION)",
              "REPO=$ACCOUNT.dkr.ecr.$REGION.amazonaws.com/x", "REGION=eu-west-1", "IP=1.2.3.4"]
    assert guide.prelude("docker push $REPO:v1", before) == before[2:5]  # the last REGION; never ARN's side effect
    assert guide.prelude("terraform -chdir=infra destroy -var region=${REGION}", before) == ["REGION=eu-west-1"]
    assert guide.prelude("dorylus aws build-context build/lambda", before) == []


def test_the_guide_runs_a_command_as_written_and_names_the_log_when_it_fails(tmp_path):
    import pytest

    from dorylus_py.errors import DorylusError

    log = tmp_path / "guide.log"
    out = guide.run("echo $GREETING-$NAME && read answer && echo $answer", ["GREETING=hello", "NAME=$(echo you)"],
                    tmp_path, {"PATH": "/usr/bin:/bin"}, log)
    assert out == "hello-you\nyes\n"  # and "yes" on its input, Terraform's confirmation
    with pytest.raises(DorylusError, match=r"`false` failed \(exit 1\); see .*guide.log"):
        guide.run("false", [], tmp_path, {"PATH": "/usr/bin:/bin"}, log)
