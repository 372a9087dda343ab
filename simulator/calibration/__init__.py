"""Measured per-operation latencies, interpolated, with their provenance."""

from simulator.calibration.grid import SOURCES, Grid
from simulator.calibration.tables import ENGINES, Calibration, Priced, load_calibration

__all__ = ["ENGINES", "SOURCES", "Calibration", "Grid", "Priced", "load_calibration"]
