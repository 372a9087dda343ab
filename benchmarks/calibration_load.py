"""Time to load every measured table of one system (target: under 2 s), cold and cached.

    .venv/bin/python benchmarks/calibration_load.py [h200 ...]
"""

import sys
import time

from simulator.calibration import load_calibration
from simulator.calibration.tables import OP_FILES
from simulator.specs.hardware import load_hardware


def main(names: list[str]) -> None:
    for name in names or ["h100", "h200", "b200", "b300", "gb200", "gb300"]:
        hw = load_hardware(name)
        t0 = time.perf_counter()
        cal = load_calibration(hw, "vllm").load_all()
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        load_calibration(hw, "vllm").load_all()
        warm = time.perf_counter() - t0
        found = sum(cal.frame(op) is not None for op in OP_FILES)
        print(f"{name:6s} {found}/{len(OP_FILES)} tables  cold {cold:.2f} s  "
              f"cached {warm * 1e3:.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
