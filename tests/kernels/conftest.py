"""Kernel tests run the Triton kernels in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any `@triton.jit` function is defined, so it is set here,
before the test modules import the kernels.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

TORCH_MISSING = "kernel tests need torch and triton: pip install 'rackplan[kernels]'"
