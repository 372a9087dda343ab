"""Whether a workload's requests fit a model's context window, checked before a simulation.

vLLM refuses a request whose prompt and output exceed the model's context (its max_model_len,
from the config's max_position_embeddings and rope scaling: ModelSpec.context_length). The
check takes each length's bound where the distribution has one a request really reaches — a
fixed value, a uniform high end — and a log-normal's median (its `max` only clips a long tail;
a tail past the window is what a real deployment would refuse, not a wrong input); a
decode_only bench adds its context. Session turns and trace rows carry their own lengths:
`check_requests_fit` checks every one of them (the caller reads the corpus or trace).
"""

from __future__ import annotations

import numpy as np

from simulator.specs.errors import SpecError
from simulator.specs.model import ModelSpec
from simulator.specs.workload import FixedLength, Length, UniformLength, Workload


def reach(length: Length) -> int:
    """The length a request of this distribution reaches: a fixed value, a uniform high end,
    a log-normal's median."""
    if isinstance(length, FixedLength):
        return length.value
    if isinstance(length, UniformLength):
        return length.high
    return round(length.median)


def check_fits_context(workload: Workload, model: ModelSpec) -> None:
    """SpecError naming the lengths when the workload's requests cannot fit the model."""
    window = model.context_length
    if window is None or workload.arrival.kind in ("trace", "sessions"):
        return
    prompt, output = reach(workload.input_tokens), reach(workload.output_tokens)
    context = workload.context_tokens if workload.mode == "decode_only" else 0
    if context + prompt + output > window:
        what = f"context_tokens {context:,} plus " if context else ""
        raise SpecError(f"{what}input_tokens of {prompt:,} and output_tokens of {output:,} "
                        f"tokens exceed {model.name}'s context of {window:,} tokens "
                        "(max_position_embeddings and rope scaling); shorten them or choose a "
                        "model with a longer context")


def check_requests_fit(what: str, prompt: np.ndarray, output: np.ndarray | int,
                       model: ModelSpec, remedy: str) -> None:
    """SpecError naming how many of `what` (session turns, trace rows) need more than the
    model's context, and the longest, when any does; `remedy` says what would fit."""
    window = model.context_length
    if window is None or not len(prompt):
        return
    need = np.asarray(prompt, dtype=np.int64) + np.asarray(output, dtype=np.int64)
    over = int((need > window).sum())
    if over:
        raise SpecError(f"{over:,} of {len(need):,} {what} ({over / len(need):.1%}) need more "
                        f"than {model.name}'s context of {window:,} tokens (the longest "
                        f"{int(need.max()):,}: prompt plus output); {remedy}, or choose a model "
                        "with a longer context")
