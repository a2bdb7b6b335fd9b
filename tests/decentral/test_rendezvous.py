"""The decentralised workers' start-up rendezvous: the launcher's own store on loopback alone, which admits only
job-key holders, and values only a job-key holder can set (torchrun's TCPStore checks nobody)."""

import psutil
import pytest
import torch.distributed as dist

from dorylus_py.decentral.rendezvous import SignedStore, rendezvous
from dorylus_py.decentral.store import StoreClient, StoreServer
from dorylus_py.errors import DorylusError

KEY = b"k" * 32


def test_the_launchers_store_listens_on_loopback_only_and_serves_a_rendezvous():
    server = StoreServer(KEY, 1)
    try:
        listening = [c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN
                     and c.laddr.port == server.port]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening)  # torch's own: "*"
        store = SignedStore(StoreClient("127.0.0.1", server.port, KEY, 10), KEY, "")
        assert rendezvous(store, 0, 1, "tcp://127.0.0.1:5", 10) == ["tcp://127.0.0.1:5"]
    finally:
        server.close()


def test_values_not_signed_with_the_job_key_are_refused():
    raw = dist.HashStore()  # what torchrun's store lets anyone who reaches it do
    ours, theirs = SignedStore(raw, KEY, ""), SignedStore(raw, b"x" * 32, "")
    ours.set("address/0", "tcp://127.0.0.1:5")
    assert ours.get("address/0") == "tcp://127.0.0.1:5"
    theirs.set("address/1", "tcp://10.9.9.9:1")  # a peer address rewritten by someone without the key
    with pytest.raises(DorylusError, match="not signed with the job key"):
        rendezvous(ours, 0, 2, "tcp://127.0.0.1:5", 10)
    raw.set("abort", "x" * 64 + "stop now")  # an abort with a made-up MAC does not stop anyone quietly
    with pytest.raises(DorylusError, match="'abort' is not signed"):
        ours.get("abort")
    other_run = SignedStore(raw, KEY, "an earlier run")
    other_run.set("address/1", "tcp://127.0.0.1:6")  # signed, but for another run: a replay
    with pytest.raises(DorylusError, match="not signed"):
        ours.get("address/1")
