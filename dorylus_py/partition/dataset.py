"""A dataset path of any kind, prepared stores included: what `dorylus check` and `dorylus train --data` read.

The data readers (``data/formats.py``) know the file formats; a folder made by ``dorylus prepare`` (or its
``s3://`` address) is this package's, put back together from its partitions.
"""

from __future__ import annotations

import os
from pathlib import Path

from dorylus_py import s3
from dorylus_py.data.formats import Sources, load_graph
from dorylus_py.data.graph import Graph
from dorylus_py.datasets import resolve
from dorylus_py.partition.store import PartitionStore


def load_dataset(path: str | os.PathLike, sources: Sources = Sources()) -> Graph:
    """The graph at ``path``: a prepared store put back together, or any format the data readers know (or a
    bundled reference graph by name, ``datasets``)."""
    path = resolve(path)
    if s3.is_s3(path) or (Path(path).is_dir() and (Path(path) / "manifest.json").exists()):
        return PartitionStore.open(path).assemble()
    return load_graph(path, sources)
