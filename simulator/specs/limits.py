"""The bounds every size in a spec or on the command line stays within, and where each comes from.

A number past one of these is not a bigger question but a typo or an attack (10**12 requests, a
prompt of a billion tokens, a search of a billion trials): it would never finish or would exhaust
memory, so it is refused before any work, by name, with the bound. Each bound is far above what
a real deployment or benchmark uses, so no real input meets it.
"""

from __future__ import annotations

MAX_REQUESTS = 10_000_000
"""Requests a workload sends in all (session turns counting one each). The longest published
serving benchmarks replay about 100,000 requests; 10^7 is a day at over 100 requests/s, and the
simulator holds a few hundred bytes per request (a few GB at the bound)."""

MAX_CONTEXT_TOKENS = 10_000_000
"""Tokens of one prompt, output, context or engine step. The longest context any open model
claims is 10M tokens (Llama 4 Scout); DeepSeek-V4 and Kimi-K2 serve 1M and 256K."""

MAX_CONCURRENCY = 1_000_000
"""Users of a closed loop or session lanes in flight at once: 10^6 is more than any serving
stack admits (vLLM's max_num_seqs per rank is 256-1024 by default, times at most MAX_GPUS
ranks would be more, but no benchmark client keeps a million connections)."""

MIN_RATE = 1e-6
"""Fewest requests per second of an open arrival: one request in 11.6 days. Below it a run's
simulated time passes 10^6 s per request and the metrics mean nothing."""

MAX_THINK_S = 86_400.0
"""Longest pause, in seconds, between a session's turns (or a think-time cap): a day. A user
who comes back after more than a day starts a new session."""

MAX_TIME_SCALE = 1_000_000.0
"""Largest factor a trace's timestamps are stretched by: a one-second gap becomes 11.6 days."""

MAX_GPUS = 200_000
"""GPUs of a deployment or a search budget: the largest single clusters built (xAI Colossus,
200,000 H100/H200 in 2025). It also bounds the search space's enumeration (a few seconds at
this size)."""

MAX_INSTANCES = 2_048
"""Engine instances of one role. The simulator builds, routes over and prices every instance
(2,048 tiny-model instances: ~7 s of set-up, growing faster than linearly); a wide-EP plan runs
a handful of DEP8-DEP72 instances, a rack of TP1 instances 72."""

MAX_NUM_SEQS = 1 << 20
"""vLLM's max_num_seqs (sequences in one rank's batch). Each sequence holds at least one KV
block of 16 tokens: 2^20 of them is 16M tokens of KV per rank, more than the largest GPU's HBM
(288 GB) holds at 16 KB per token, while vLLM's default is 256-1024. The simulator allocates
per-slot arrays of this length."""

MAX_DRAFT_TOKENS = 64
"""Speculative tokens drafted per step. A draft token survives only if every one before it was
accepted (acceptance^k): at the best reported acceptance (0.9) the 64th adds 0.001 tokens;
vLLM's MTP configurations use 1-4."""

MAX_RECV_INTERVAL = 1_000
"""Most decode steps between SGLang's scheduler taking in requests (`recv_interval`); InferenceX's
recipes use 10 and 30, and a larger one would keep a request waiting for seconds."""

MAX_HOST_GB = 65_536.0
"""GiB of host memory per GPU (CPU offload, the host KV tier): 64 TiB, more than any machine
has in all (the largest hosts carry 32 TB for 8 GPUs)."""

MAX_TRIALS = 100_000
"""Trials of one search. The default is 100; each trial is one simulation (seconds), so 10^5
is days of CPU, and Optuna's TPE sampler slows with the size of the history."""

MAX_BATCH = 1_024
"""Points a search round chooses together (--batch): each is held, screened and simulated in
the round; the default is 4 and a round of 1,024 already outnumbers any machine's cores."""

MAX_REFINE = 100
"""Rounds of local search after a search's trials (`rackplan search --refine`): each simulates
at most a few dozen neighbours of the best plan, and a round that finds nothing better ends
them."""

MAX_WORKERS = 256
"""Local worker processes (search, validate): each is its own interpreter and simulator
(~150 MB), so 256 is ~40 GB, and more than the cores of any one machine."""

MAX_SEED = 2**32 - 1
"""Largest seed: numpy's and Optuna's samplers take seeds in [0, 2^32 - 1]."""
