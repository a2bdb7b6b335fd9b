"""Run one `dorylus` command in this process and print, as JSON, its exit code and peak memory (the kernel's
high-water marks: this process's own, and the largest of the children it waited for), in MB:

    python -m tests.memory_probe EDGE_BLOCK dorylus-args...

``EDGE_BLOCK`` sets how many edges every streaming step holds at once (4 M in the product; 0 keeps that),
so that a graph of CI size spans as many blocks as a graph of hundreds of millions of edges does.
"""

from __future__ import annotations

import json
import resource
import sys


def small_blocks(edges: int) -> None:
    """The streaming steps' block sizes (synth's sampling, the CSR's passes, the external sort's buckets)."""
    import dorylus_py.data.extsort as extsort
    import dorylus_py.data.synth as synth
    import dorylus_py.partition.csr as csr

    csr.EDGE_BLOCK = extsort.BUCKET_KEYS = synth.SAMPLE_BLOCK = edges
    csr.DiskCSR.row_ranges.__defaults__ = (edges,)


def own_peak_mb() -> float:
    """This process's high-water mark since its exec (VmHWM). Not ``ru_maxrss``: Linux carries the memory
    the parent had when it forked across the exec into it, so a probe started by a test runner that has grown
    to 700 MB would read 700 MB whatever the command held."""
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024  # kB


def main(argv: list[str]) -> int:
    if int(argv[0]):
        small_blocks(int(argv[0]))
    from dorylus_py.cli import main as dorylus

    code = dorylus(argv[1:])
    children_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # kB on Linux
    print(json.dumps({"code": code, "self_mb": own_peak_mb(), "children_mb": children_mb}))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
