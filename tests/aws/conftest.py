"""A moto server for the AWS tests (S3, IAM, EC2, Lambda control plane), reachable from subprocesses."""

from __future__ import annotations

import pytest


@pytest.fixture()
def moto_url(monkeypatch, tmp_path):
    pytest.importorskip("moto.server")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    import requests
    from moto.server import ThreadedMotoServer

    monkeypatch.setenv("MOTO_RECORDER_FILEPATH", str(tmp_path / "moto_recording"))  # not in the working tree
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    requests.post(f"{url}/moto-api/reset", timeout=10)  # moto's state is per process, not per server
    requests.post(f"{url}/moto-api/config", json={"lambda": {"use_docker": False}}, timeout=10)  # no Docker here
    for k, v in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "DORYLUS_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield url
    server.stop()
