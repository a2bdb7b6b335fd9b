"""A moto server for the AWS tests (S3, IAM, EC2, Lambda control plane, Secrets Manager), reachable from
subprocesses; ``moto_aws.enforce(True)`` makes it check every request against IAM as AWS would
(``dorylus_py/rehearsal/moto_aws.py``)."""

from __future__ import annotations

import pytest


@pytest.fixture()
def moto_aws(monkeypatch, tmp_path):
    pytest.importorskip("moto.server")
    from dorylus_py.rehearsal.moto_aws import MotoAws

    monkeypatch.setenv("MOTO_RECORDER_FILEPATH", str(tmp_path / "moto_recording"))  # not in the working tree
    aws = MotoAws()
    url = aws.start()
    for k, v in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "DORYLUS_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    yield aws
    aws.stop()


@pytest.fixture()
def moto_url(moto_aws):
    return moto_aws.url
