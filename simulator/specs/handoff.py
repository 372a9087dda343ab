"""How a P/D deployment hands a prompt's KV from prefill to decode, as rackplan deploys it on
vLLM, and what the decode instance then computes itself.

One table, read by both the executor (which connector `--kv-transfer-config` names) and the
simulator (what the decode instance's first step of a handed-over request computes):

- GPUs: NixlConnector moves every block of the prompt. vLLM's scheduler then recomputes the
  prompt's last token on the decode instance to sample the first output token, which costs what
  a decode row costs, so the first step is an ordinary decode step.
- The `cpu` hardware: ExampleConnector (vLLM's shared-storage reference connector; with
  NixlConnector the CPU build's decode worker dies in the transfer). It works in whole blocks,
  with `align(x) = (x - 1) // block * block` (vllm/distributed/kv_transfer/kv_connector/v1/
  example_connector.py): the prefill instance stores the first `align(n)` tokens of an
  n-token prompt, and the decode instance looks for the first `align(n - 1)`. Where the two
  agree it loads them and computes the rest of the prompt in its first step (32 of a 64-token
  prompt at 32-token blocks); where they differ (n - 1 a multiple of the block) it finds
  nothing and computes the whole prompt. That step is a prefill chunk beside the other
  requests' decode rows, and it delays their tokens as well.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_HARDWARE = "cpu"
"""The hardware preset whose deployments run vLLM's CPU build."""


@dataclass(frozen=True)
class Handoff:
    """A P/D KV connector as rackplan deploys it."""

    connector: str
    """vLLM's `kv_connector` name."""
    block_tokens: int | None = None
    """KV block size the deployment runs with, for a connector that hands over whole blocks
    only and leaves the decode instance the prompt's tail (None: it hands over all of the
    prompt but its last token)."""
    shared_folder: bool = False
    """The connector hands KV over through files in a folder both instances reach (its
    `shared_storage_path`)."""

    def tail(self, prompt: float) -> float:
        """Prompt tokens the decode instance computes itself in a handed-over request's first
        step, when more than the one token a decode row computes (0: an ordinary decode
        row)."""
        block = self.block_tokens
        if block is None or prompt < 2:
            return 0.0
        n = int(prompt)
        stored, looked_for = (n - 1) // block * block, (n - 2) // block * block
        return prompt - (looked_for if looked_for == stored else 0)


CPU_BLOCK_SIZE = 32
"""KV block size on CPU. ExampleConnector hands over whole blocks only: the CPU default of 128
would hand over nothing for prompts shorter than 130 tokens."""

HANDOFFS: dict[str, Handoff] = {
    "gpu": Handoff("NixlConnector"),
    CPU_HARDWARE: Handoff("ExampleConnector", CPU_BLOCK_SIZE, shared_folder=True),
}
"""Kind of hardware -> the connector rackplan's vLLM deployments hand over with."""


def handoff_for(hardware: str) -> Handoff:
    """The P/D handoff of deployments on the hardware preset named `hardware`."""
    return HANDOFFS[CPU_HARDWARE if hardware.lower() == CPU_HARDWARE else "gpu"]
