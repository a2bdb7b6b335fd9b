"""Where decentralised workers meet at start-up: a torch ``Store`` whose values are signed with the job key.

Each worker publishes its address and waits for everyone's; the launcher (or rank 0 under torchrun) may
publish ``abort`` instead. Under torchrun the store is torchrun's ``TCPStore``, which has no
authentication, so every value carries an HMAC-SHA256 of the run's id, its key and itself under the job
key: a value set by anyone without the key (who can reach the store's port) is refused, so nobody can
redirect a worker's peers or abort the job, only make the start fail. On one machine the launcher's own
store (``store.py``) listens on loopback only, admits key holders alone and caps what it holds. What
torchrun's store still exposes is in docs/gossip.md.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time


from dorylus_py.errors import DorylusError

MAC_HEX = 64


class SignedStore:
    """Values of ``store`` signed and checked with the job ``key``, bound to ``run`` (the run's id)."""

    def __init__(self, store: dist.Store, key: bytes, run: str):
        self.store, self._key, self.run = store, key, run

    def _mac(self, name: str, value: str) -> str:
        return hmac.new(self._key, f"{self.run}\0{name}\0{value}".encode(), hashlib.sha256).hexdigest()

    def set(self, name: str, value: str) -> None:
        self.store.set(name, self._mac(name, value) + value)

    def check(self, names: list[str]) -> bool:
        return self.store.check(names)

    def get(self, name: str) -> str:
        """The value of ``name``, or DorylusError when it is not signed with the job key for this run."""
        raw = self.store.get(name).decode(errors="replace")
        mac, value = raw[:MAC_HEX], raw[MAC_HEX:]
        if not hmac.compare_digest(mac.encode(), self._mac(name, value).encode()):
            raise DorylusError(f"the rendezvous value {name!r} is not signed with the job key (someone else wrote it)")
        return value


def rendezvous(store: SignedStore, rank: int, world: int, address: str, timeout_s: float) -> list[str]:
    """Publish this worker's address; every worker's, once all are ready (the only moment all wait)."""
    store.set(f"address/{rank}", address)
    keys = [f"address/{r}" for r in range(world)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if store.check(["abort"]):
            raise DorylusError(f"the job was abandoned at its start: {store.get('abort')}")
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([f"address/{r}"])]
            raise DorylusError(f"workers {missing} did not start within {timeout_s:g} s")
        time.sleep(0.05)  # polling a store at start-up, not synchronising a test
    return [store.get(k) for k in keys]


def run_id() -> str:
    """This run's id under torchrun (its rendezvous id and restart), so no signed value of an earlier run
    (with the same job key) is accepted in this one; empty for a local launch, whose key is its own."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
