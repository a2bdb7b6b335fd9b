"""Partitioning for graph servers: the streaming prepare (METIS, Fennel, hash), layouts, the store."""

from dorylus_py.partition.dataset import load_dataset
from dorylus_py.partition.layout import FEATURE_DTYPES, Partition
from dorylus_py.partition.partitioners import PARTITIONERS, assign
from dorylus_py.partition.store import PartitionStore, prepare

__all__ = ["FEATURE_DTYPES", "PARTITIONERS", "Partition", "PartitionStore", "assign", "load_dataset", "prepare"]
