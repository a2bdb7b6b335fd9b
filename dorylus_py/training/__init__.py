"""Training drivers and the run record."""

from dorylus_py.training.record import RunRecord
from dorylus_py.training.reference import TrainResult, train_reference

__all__ = ["RunRecord", "TrainResult", "train_reference"]
