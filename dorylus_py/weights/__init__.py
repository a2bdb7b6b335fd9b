"""The weight server: versioned weights, gradient accumulation, Adam (``store.py``), served over ZeroMQ."""

from dorylus_py.weights.store import WeightError, WeightStore

__all__ = ["WeightError", "WeightStore"]
