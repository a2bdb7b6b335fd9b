"""A GPU's speed measured by a ``--backend gpu`` run's record. Apart from :mod:`gpu` (what GPUs there are and
the assumed speed) because it reads records through the estimator's calibration, which itself builds on
:mod:`gpu`: kept here, above both, the import graph has no circle."""

from __future__ import annotations

from dorylus_py.cost.estimate import Calibration, setup_of
from dorylus_py.cost.gpu import GPUS, GpuSpeed, gpu_of
from dorylus_py.cost.model import read_record
from dorylus_py.errors import ConfigError, DataError


def gpu_speed_from_record(cal: Calibration, run_dir: str, instance: str,
                          gather_speedup: float | None = None) -> GpuSpeed:
    """Measured: a ``--backend gpu`` run's tensor rate on ``instance``'s GPU against ``cal``'s per-worker
    rate (its tensor threads share one GPU, so the GPU's rate is their summed durations over the threads),
    and its Gather rate against ``cal``'s (unless ``gather_speedup`` is given); the other GPUs are scaled
    from it by bandwidth."""
    gpu = gpu_of(instance)
    if gpu is None:
        raise ConfigError(f"--gpu-calibration-instance {instance!r} has no GPU this estimator knows "
                          f"(families: {', '.join(GPUS)})")
    config = read_record(run_dir)[0]
    if config.get("backend") != "gpu":
        raise DataError(f"{run_dir}: --gpu-calibration needs a --backend gpu run, not {config.get('backend')!r}")
    measured = Calibration.from_record(run_dir, instance)
    if measured.tensor_s_per_unit <= 0:
        raise DataError(f"{run_dir}: its tensor tasks took no time beyond their fixed cost; no GPU rate to use")
    threads = setup_of(config, instance).tensor_threads
    gather = gather_speedup or cal.graph_s_per_unit / max(measured.graph_s_per_unit, 1e-30)
    return GpuSpeed(gpu, cal.tensor_s_per_unit * threads / measured.tensor_s_per_unit, True,
                    f"measured on {instance} ({gpu}) by {run_dir}", gather)
