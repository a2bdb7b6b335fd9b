"""Graph datasets: the :class:`Graph` type, file formats, synthetic generators."""

from dorylus_py.data.formats import (
    Sources,
    from_pyg,
    load_graph,
    write_bsnap,
    write_npz,
)
from dorylus_py.data.graph import Graph, random_split, row_normalized
from dorylus_py.data.synth import SynthConfig, generate

__all__ = [
    "Graph",
    "Sources",
    "SynthConfig",
    "from_pyg",
    "generate",
    "load_graph",
    "random_split",
    "row_normalized",
    "write_bsnap",
    "write_npz",
]
