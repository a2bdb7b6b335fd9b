"""GPU graph servers in the estimate (``--backend gpu``): which EC2 types carry which GPU, and how fast a
GPU does a graph server's tensor work, beside the paper's comparison of GPU servers with CPU servers +
Lambdas.

No GPU calibration exists: this project is measured on machines without a GPU. A GPU's speed is therefore
an assumption, printed with every estimate that uses it, unless a ``--backend gpu`` run's record measures
it (``gpu_measured.gpu_speed_from_record``). ``speedup`` says how many times as fast as one tensor worker of the
calibration (a Lambda, or one tensor thread of a ``cpu`` server) one GPU does the dense part of the
tensor tasks (the calibration's per-unit rate). The fixed cost of a task (taking its rows, starting) is
host work, not sped up. Gather runs on the GPU too (``graph_servers/device_rows.py``), assumed as many
times as fast as on a calibration server as the dense work is over one worker, unless ``gather_speedup``
is given.

Default speed-ups: a V100 (p3) is assumed to do the dense work 10x as fast as one calibrated worker (an
assumption, not a measurement: every task's rows cross PCIe, which at GCN's widths bounds what the GPU's
arithmetic can gain); the other GPUs are scaled from it by memory bandwidth (NVIDIA's datasheets), since
multiplying N x F rows by an F x H matrix with F, H in the hundreds is memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from dorylus_py.errors import ConfigError

# EC2 family -> (its GPU, the GPU's memory bandwidth in GB/s from NVIDIA's datasheets). One GPU per
# graph server: these families' single-GPU sizes (xlarge to 8xlarge; p3.2xlarge) are what the search tries.
GPUS = {"p3": ("V100", 900.0), "g4dn": ("T4", 320.0), "g5": ("A10G", 600.0), "g6": ("L4", 300.0)}
SEARCHED = ("g4dn.xlarge", "g4dn.2xlarge", "g5.xlarge", "g5.2xlarge", "g6.xlarge", "g6.2xlarge", "p3.2xlarge")
ANCHOR = ("V100", 10.0)  # the assumed speed-up of one GPU, from which the others are scaled by bandwidth
WEIGHT_SERVER = "c5.xlarge"  # weight servers beside GPU graph servers (infra's weight_server_type): no GPU work
KINDS = {"lambda": "CPU servers + Lambdas", "cpu": "CPU servers only", "gpu": "GPU servers only"}


def gpu_of(instance: str) -> str | None:
    """The GPU of an EC2 type (``g5.xlarge`` -> ``A10G``), None for a type without one in ``GPUS``."""
    found = GPUS.get(instance.split(".", 1)[0])
    return found[0] if found else None


def weight_server_type(instance: str, given: str = "") -> str:
    """What the weight servers beside ``instance`` graph servers run on: ``given``, else the same type,
    or a CPU type beside GPUs (weight servers do no GPU work)."""
    return given or (WEIGHT_SERVER if gpu_of(instance) else instance)


def _bandwidth(gpu: str) -> float:
    return next(bw for name, bw in GPUS.values() if name == gpu)


@dataclass(frozen=True)
class GpuSpeed:
    """How fast a GPU does a graph server's tensor work, relative to one calibrated tensor worker:
    ``base`` for the GPU ``gpu``, the others scaled by memory bandwidth (``scaled``), or ``base`` for
    every GPU (not ``scaled``: ``--gpu-speedup``, a number the user knows)."""

    gpu: str = ANCHOR[0]
    base: float = ANCHOR[1]
    scaled: bool = True
    source: str = "assumed (no GPU calibration)"
    gather_speedup: float | None = None  # Gather on the GPU, x the calibration server's; None: as ``speedup``

    @classmethod
    def given(cls, speedup: float | None, gather_speedup: float | None = None) -> "GpuSpeed":
        """``--gpu-speedup`` (one factor for every GPU) or the default assumption; ``--gpu-gather-speedup``."""
        for flag, value in (("--gpu-speedup", speedup), ("--gpu-gather-speedup", gather_speedup)):
            if value is not None and not value > 0:
                raise ConfigError(f"{flag} must be a positive factor, not {value}")
        if speedup is None:
            return cls(gather_speedup=gather_speedup)
        return cls(base=speedup, scaled=False, source="given (--gpu-speedup)", gather_speedup=gather_speedup)

    def speedup(self, instance: str) -> float:
        if not self.scaled:
            return self.base
        gpu = gpu_of(instance)
        if gpu is None:
            raise ConfigError(f"--backend gpu needs a GPU instance type (families {', '.join(GPUS)}), not {instance!r}")
        return self.of_gpu(gpu)

    def gather(self, instance: str) -> float:
        """Gather on ``instance``'s GPU, x a calibration server's: given, or assumed as the dense work's."""
        return self.gather_speedup or self.speedup(instance)

    def of_gpu(self, gpu: str) -> float:
        return self.base * _bandwidth(gpu) / _bandwidth(self.gpu) if self.scaled else self.base

    def describe(self, instances: list[str]) -> str:
        """One line for the estimate's header: what was assumed or measured, per GPU."""
        gpus = sorted({gpu_of(i) for i in instances if gpu_of(i)}, key=_bandwidth)
        rates = ", ".join(f"{g} {self.of_gpu(g):.3g}x" for g in gpus)
        gather = (f"Gather {self.gather_speedup:g}x the calibration server's" if self.gather_speedup
                  else "Gather on the GPU at the same factors x the calibration server's")
        return f"GPU tensor speed per GPU, x one calibrated tensor worker: {rates}; {self.source}; {gather}"


def comparison(rows: list[dict]) -> list[dict]:
    """The paper's comparison: the best-value configuration of each kind, its value against the best
    value of CPU servers + Lambdas (``value vs lambda``)."""
    best = {}
    for row in rows:
        if row["backend"] in KINDS and (row["backend"] not in best or row["value"] > best[row["backend"]]["value"]):
            best[row["backend"]] = row
    ref = best.get("lambda", {}).get("value")
    return [best[b] | {"kind": KINDS[b], "value vs lambda": best[b]["value"] / ref if ref else float("nan")}
            for b in KINDS if b in best]
