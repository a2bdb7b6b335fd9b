"""Time is one setting: the dilation D of a scale model (DieCast, NSDI 2008), and every duration through it.

A scale model gives each emulated host 1/D of the CPU it models (``cgroups.py``), so everything
runs D times slower; for what each host sees to stay what a real host sees, every delay, timeout,
heartbeat and deadline is D times longer, every link rate D times lower, and measured times are divided
by D (the model's time). D lives in one place, the environment variable ``DORYLUS_DILATION``, because
that is what every process of a job has before anything else: the servers a supervisor starts before
their job exists, emulated Lambdas, the lab's Lambda service. ``dorylus train --dilation D`` exports it
(``export``) before it starts a process, and ``dorylus lab run --dilation D`` gives it to every host.

Every duration of a job goes through :func:`scaled` (or :func:`scaled_ms`), and every settings value
that is a duration or a rate through :func:`dilate` (``DURATION_SETTINGS``, ``RATE_SETTINGS``);
``tests/scale_model/test_durations.py`` scans the source for one that does not. Only the standard
library is imported.
"""

from __future__ import annotations

import dataclasses
import math
import os

from dorylus_py.errors import ConfigError

ENV = "DORYLUS_DILATION"
MAX_DILATION = 64.0  # beyond this a CFS quota of a small host is below the kernel's 1 ms minimum

# Settings (sections.py) that are durations (x D) and rates (/ D) in a dilated run.
DURATION_SETTINGS = ("lambda_latency_ms", "lambda_cold_start_ms", "lambda_timeout_s", "relaunch_min_s",
                     "wait_timeout_s", "hang_timeout_s", "replace_timeout_s", "peer_timeout_s", "fresh_wait_ms",
                     "lease_idle_ms")
RATE_SETTINGS = ("lambda_bandwidth_mbps",)


def check_dilation(d: float, flag: str = "--dilation") -> float:
    if not isinstance(d, (int, float)) or isinstance(d, bool) or not math.isfinite(d) or not 1.0 <= d <= MAX_DILATION:
        raise ConfigError(f"{flag} must be a number in [1, {MAX_DILATION:g}], got {d!r}")
    return float(d)


def dilation() -> float:
    """This process's D (1: no scale model)."""
    text = os.environ.get(ENV, "")
    if not text:
        return 1.0
    try:
        return check_dilation(float(text), ENV)
    except ValueError:
        raise ConfigError(f"{ENV} must be a number in [1, {MAX_DILATION:g}], got {text[:20]!r}") from None


def scaled(seconds: float) -> float:
    """A duration of the modelled cluster as this box waits it: ``seconds`` x D."""
    return seconds * dilation()


def scaled_ms(ms: float) -> int:
    return int(round(ms * dilation()))


def model_s(raw_seconds: float) -> float:
    """A time measured on this box as the modelled cluster would see it: raw / D."""
    return raw_seconds / dilation()


def export(d: float) -> None:
    """Make ``d`` this process's D, and so its children's; a different D already set is an error (the
    processes of one job must agree)."""
    d = check_dilation(d)
    if ENV in os.environ and dilation() != d:
        raise ConfigError(f"--dilation {d:g} disagrees with {ENV}={os.environ[ENV]} in the environment")
    if d == 1.0:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = repr(d)


def dilate(cfg, d: float | None = None):
    """``cfg`` (a TrainConfig) as the processes of a dilated run use it: durations x D, rates / D. The run
    record keeps the model's values (what was asked); only what runs gets these."""
    d = dilation() if d is None else d
    if d == 1.0:
        return cfg
    values = {name: getattr(cfg, name) * d for name in DURATION_SETTINGS
              if isinstance(getattr(cfg, name), (int, float))}  # ``auto`` is the run plan's, resolved before
    values |= {name: getattr(cfg, name) / d for name in RATE_SETTINGS}
    return dataclasses.replace(cfg, **values)


def model_view(d: float, metrics: list[dict], tasks: list[dict], summary: dict) -> tuple[list, list, dict]:
    """A run record's times as the modelled cluster saw them (raw / ``d``): what reports and the cost
    estimator read. Lambda billing scales with the time a task ran."""
    if d == 1.0:
        return metrics, tasks, summary
    metrics = [m | {k: m[k] / d for k in ("epoch_s", "wall_s") if isinstance(m.get(k), (int, float))} for m in metrics]
    tasks = [t | {k: t[k] / d for k in ("start", "end", "billed_ms") if isinstance(t.get(k), (int, float))}
             for t in tasks]
    summary = summary | {k: summary[k] / d for k in ("wall_s", "median_epoch_s", "job_s")
                         if isinstance(summary.get(k), (int, float))}
    return metrics, tasks, summary


def model_times(d: float, summary: dict) -> dict:
    """What a run record's summary adds for a scale model of dilation ``d``: D and the model's times
    (raw / D); the raw times stay in their own fields."""
    if d == 1.0:
        return {}
    return {"dilation": d} | {f"model_{k}": summary[k] / d for k in ("wall_s", "median_epoch_s", "job_s")
                              if isinstance(summary.get(k), (int, float))}
