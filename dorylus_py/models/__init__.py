"""GNN models."""

from dorylus_py.models.gcn import GCN, glorot_

__all__ = ["GCN", "glorot_"]
