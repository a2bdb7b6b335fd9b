"""Prices, the cost model and reports, computed from run records only."""

from dorylus_py.cost.model import Prices, RunCost, read_record, run_cost

__all__ = ["Prices", "RunCost", "read_record", "run_cost"]
