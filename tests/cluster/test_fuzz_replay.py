"""A fuzz failure replays: the corpus is a function of its seed in every process (``DORYLUS_FUZZ_SEED``).

Only the envelope frame (random sender id, clock, MAC) may differ between two processes; every other
frame, and the number of messages, must be the same for the same seed and differ for another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGEST = """
import hashlib, sys
from tests.cluster.fuzz_corpus import corpus
h, n = hashlib.sha256(), 0
for frames in corpus(sys.argv[1], bytes(range(32)), "tcp://127.0.0.1:5", 300, seed=int(sys.argv[2])):
    n += 1
    for frame in frames[1:]:
        h.update(len(frame).to_bytes(8, "big") + frame)
print(n, h.hexdigest())
"""


def digest(role: str, seed: int) -> str:
    out = subprocess.run([sys.executable, "-c", DIGEST, role, str(seed)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_same_seed_gives_the_same_corpus_in_another_process():
    for role in ("graph-server", "driver"):
        first = digest(role, 17)
        assert first == digest(role, 17), f"{role}: two processes drew different corpora from seed 17"
        assert first != digest(role, 18)
