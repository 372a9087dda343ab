"""rackplan executor: a plan rendered as typed launch records, launched by a backend."""

from executor.records import DataParallel, LaunchRecord, Rendered
from executor.render import render

__all__ = ["DataParallel", "LaunchRecord", "Rendered", "render"]
