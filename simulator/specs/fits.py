"""Whether a workload's requests fit a model's context window, checked before a simulation.

vLLM refuses a request whose prompt and output exceed the model's context (its max_model_len,
from the config's max_position_embeddings and rope scaling: ModelSpec.context_length). The
check takes each length's bound where the distribution has one a request really reaches — a
fixed value, a uniform high end — and a log-normal's median (its `max` only clips a long tail;
a tail past the window is what a real deployment would refuse, not a wrong input); a
decode_only bench adds its context. Session turns grow their context turn by turn and traces
carry their own lengths: the first turn and the spec's lengths are what is checked here.
"""

from __future__ import annotations

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
