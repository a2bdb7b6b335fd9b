"""Tensor maths shared by the reference trainer, graph servers, Lambdas and the cpu/gpu backends."""

from dorylus_py.kernels.sparse import NormalizedAdjacency, gcn_norm_weights, spmm

__all__ = ["NormalizedAdjacency", "gcn_norm_weights", "spmm"]
