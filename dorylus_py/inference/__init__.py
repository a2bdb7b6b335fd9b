"""Using a trained model: its run record read back (``trained``), predictions for every vertex
(``predict``), and export to PyG or plain torch (``export``)."""

from dorylus_py.inference.predict import Predictions, predict_graph, run_dataset, write_predictions
from dorylus_py.inference.trained import TrainedModel, load_trained

__all__ = ["Predictions", "TrainedModel", "load_trained", "predict_graph", "run_dataset", "write_predictions"]
