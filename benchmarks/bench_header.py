"""What a message's header costs a process: microseconds to encode and to decode-and-check the headers a
graph server sends and receives most (a task with its rows, a result, ghost rows, progress, an ack), as
MessagePack against the schema (``protocol/header.py``, the product) and as the JSON the wire used
before (``json.dumps`` and the bounded parser, ``protocol/bounded_json.py``). Medians of ``--rounds``
rounds of ``--count`` messages each; the last column is the JSON path's time over the schema's.

    python benchmarks/bench_header.py [--rounds 7 --count 20000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from dorylus_py.protocol.bounded_json import parse_object
from dorylus_py.protocol.header import TensorSpec, decode_header, encode_header

TASK = {"lease": "6f1c2a", "task": {"kind": "fwd", "train": True, "epoch": 7, "layer": 0, "chunk": 3},
        "version": 41, "rows": [1875, 602], "have": ["a3f9c1d2e4b5"], "stream": 0}
HEADERS = {  # op, tensors (name, dtype, shape), fields: as the Reddit shape's graph server sends them
    "task": ("task", [("rows", "float32", [1875, 602])], TASK),
    "result": ("result", [("Z", "float32", [1875, 128]), ("dW", "float32", [602, 128])],
               {"lease": "6f1c2a", "task": TASK["task"], "version": 41, "compute_s": 0.0123}),
    "ghosts": ("ghosts", [("rows", "float32", [7500, 128]), ("positions", "int32", [7500])],
               {"src": 1, "layer": 0, "chunk": 3, "phase": "fwd", "epoch": 7}),
    "progress": ("progress", [], {"src": 1, "epoch": 7, "stage": 4, "chunks": [0, 1, 2, 3, 4, 5, 6, 7]}),
    "ok": ("ok", [], {"req": "r-1041"}),
}


def _json_pair(op, tensors, fields):
    specs = [{"name": n, "dtype": d, "shape": s} for n, d, s in tensors]
    encode = lambda: json.dumps({"op": op, "tensors": specs, **fields}, separators=(",", ":"),  # noqa: E731
                                allow_nan=False).encode()
    raw = encode()
    return encode, lambda: parse_object(raw, "header")


def _schema_pair(op, tensors, fields):
    encode = lambda: encode_header(op, [TensorSpec(n, d, s) for n, d, s in tensors], fields)  # noqa: E731
    raw = encode()
    return encode, lambda: decode_header(raw)


def _us(fn, count: int) -> float:
    t = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - t) / count * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--count", type=int, default=20000)
    args = ap.parse_args()
    print("| header | bytes (JSON / MessagePack) | encode us (JSON / schema) | decode us (JSON / schema) | JSON / schema |")
    print("| --- | --- | --- | --- | --- |")
    for name, spec in HEADERS.items():
        pairs = {"json": _json_pair(*spec), "schema": _schema_pair(*spec)}
        times = {k: ([], []) for k in pairs}
        for _ in range(args.rounds):  # interleaved, so a slower moment of the box hits both
            for kind, (enc, dec) in pairs.items():
                times[kind][0].append(_us(enc, args.count))
                times[kind][1].append(_us(dec, args.count))
        med = {k: [statistics.median(x) for x in v] for k, v in times.items()}
        sizes = [len(pairs[k][0]()) for k in ("json", "schema")]
        ratio = sum(med["json"]) / sum(med["schema"])
        print(f"| {name} | {sizes[0]} / {sizes[1]} | {med['json'][0]:.2f} / {med['schema'][0]:.2f} | "
              f"{med['json'][1]:.2f} / {med['schema'][1]:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
