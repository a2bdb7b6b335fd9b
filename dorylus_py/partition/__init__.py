"""Partitioning for graph servers: assignment (METIS, hash), per-partition layout, the store."""

from dorylus_py.partition.layout import Partition, build_partitions, edge_cut
from dorylus_py.partition.partitioners import PARTITIONERS, assign
from dorylus_py.partition.store import PartitionStore, prepare

__all__ = ["PARTITIONERS", "Partition", "PartitionStore", "assign", "build_partitions", "edge_cut", "prepare"]
