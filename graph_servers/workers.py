"""Where a graph server's tensor tasks run: threads of its own (``cpu``/``gpu``), emulated Lambdas
(``local``) or AWS Lambda (``lambda``), with its share of ``--lambdas``."""

from __future__ import annotations

from dorylus_py.devices import cuda_devices, device_for, local_rank
from dorylus_py.models.spec import ModelSpec
from dorylus_py.platforms import InprocPlatform, LocalLambdaPlatform
from dorylus_py.sections import LAMBDA_BACKENDS, OFFLOAD_FLOPS_PER_BYTE
from dorylus_py.serving.job import JobSpec
from dorylus_py.serving.node import ServerNode
from dorylus_py.worker.event import LeaseEvent
from dorylus_py.worker.task_runner import TaskRunner
from graph_servers.direct import DirectWorkers


def server_device(spec: JobSpec, rank: int) -> str:
    """The torch device of this graph server's graph stages and in-process tensor tasks: ``cpu`` when its
    tasks run in Lambdas. Checked here, on the server's host (``devices.py``)."""
    cfg = spec.config
    if cfg.backend in ("local", "lambda"):
        return "cpu"
    return device_for(cfg.device, cfg.backend, rank, local_rank(spec.graph_servers, rank), cuda_devices())


def direct_workers(node: ServerNode, threads: int, event: LeaseEvent, usage=None) -> DirectWorkers:
    """``threads`` of the server's own that run ``event``'s lease, with a signing session of their own (for
    the weight servers); ``usage``: the server's CPU accounting, which counts their tensor work."""
    session, gate = node.session.sibling(), node.gate
    return DirectWorkers(node.ctx, node.poller, threads, lambda: TaskRunner(event, session, gate),
                         usage.on_tensor_thread if usage is not None else None)


def tasks_here(model: ModelSpec, stages, cfg) -> frozenset[tuple[str, int]]:
    """``(kind, layer)`` of the tensor tasks a graph server runs in its own threads: every one on the ``cpu``
    and ``gpu`` backends; with ``--offload auto``, those doing less than :data:`OFFLOAD_FLOPS_PER_BYTE`
    FLOPs for each byte they would move over a Lambda's link (``ModelSpec.link_intensity``): on Dorylus's
    Reddit shape the narrow layer, the loss and evaluation, whose stages are link-bound chains an epoch
    waits on (issue 53), while layer 0's ApplyVertex (301 FLOPs a byte) still goes to Lambdas."""
    tasks = {(s.task, s.layer) for s in stages if s.task is not None}
    if cfg.backend not in LAMBDA_BACKENDS:
        return frozenset(tasks)
    if cfg.offload == "all":
        return frozenset()
    return frozenset(t for t in tasks
                     if (i := model.link_intensity(*t)) is not None and i < OFFLOAD_FLOPS_PER_BYTE)


def make_platform(spec: JobSpec, rank: int, node: ServerNode, device: str, direct_event: LeaseEvent, usage=None):
    """Where this server's tensor tasks run; ``--lambdas`` is shared out among the graph servers. In-process
    threads run ``direct_event``'s lease with a signing session of their own (for the weight servers),
    emulated Lambdas get the job key (their own environment); ``usage``: the server's CPU accounting,
    which counts its own threads' tensor work."""
    cfg = spec.config
    if cfg.backend not in LAMBDA_BACKENDS:
        return InprocPlatform(direct_workers(node, cfg.tensor_threads, direct_event, usage), device)
    per_server = spec.lambda_share[0]  # the run plan's share of --lambdas
    seed = cfg.seed * 1000 + rank + 7919 * spec.restart
    if cfg.backend == "local":
        return LocalLambdaPlatform(per_server, cfg.lambda_latency_ms, cfg.lambda_fail_rate, cfg.lambda_memory_mb,
                                   cfg.lambda_timeout_s, seed=seed, cold_start_ms=cfg.lambda_cold_start_ms,
                                   key=node.job_key, bandwidth_mbps=cfg.lambda_bandwidth_mbps)
    from dorylus_py.platforms.aws import AwsLambdaPlatform

    return AwsLambdaPlatform(cfg.lambda_function, per_server, cfg.lambda_memory_mb, cfg.aws_region or None,
                             cfg.aws_profile or None, cfg.lambda_endpoint or None, cfg.lambda_timeout_s,
                             run_here=cfg.lambda_run_here, seed=seed, key=node.job_key)
