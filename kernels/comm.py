"""Collectives over torch.distributed: gloo between 2 CPU processes, NCCL between GPUs.

`run` spawns one process per rank (torch.multiprocessing); there each collective is first
checked on known data (a wrong result fails the run), then every shape is timed and the rows go
back through a queue. Each sample is one collective between barriers; a sample's time is
the slowest rank's (an all-reduce of the per-rank times with MAX), as a step waits for all.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kernels.checks import KernelMismatch
from kernels.device import Device
from kernels.shapes import CommShape
from kernels.timing import summarize

BACKEND = {"cpu": "gloo", "cuda": "nccl"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collective(op: str, nbytes: int, ranks: int,
                dev: str) -> tuple[Callable[[], None], torch.Tensor, torch.Tensor]:
    """A call doing `op` on a bf16 buffer of `nbytes` (whole-buffer size), its input, output."""
    elems = max(nbytes // 2 // ranks, 1) * ranks
    rank = dist.get_rank()
    whole = torch.arange(elems, device=dev, dtype=torch.float32).remainder(16).add(rank)
    whole = whole.to(torch.bfloat16)
    part = whole[: elems // ranks].clone()
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    if op == "all_gather":
        out = torch.empty(elems, dtype=torch.bfloat16, device=dev)
        return lambda: gather(out, part), part, out
    if op == "reduce_scatter":
        out = torch.empty(elems // ranks, dtype=torch.bfloat16, device=dev)
        return lambda: scatter(out, whole), whole, out
    if op == "all_reduce":
        buf = whole.clone()
        return lambda: dist.all_reduce(buf), whole, buf
    out = torch.empty_like(whole)
    return lambda: dist.all_to_all_single(out, whole), whole, out


def _expected(op: str, inp: torch.Tensor, ranks: int) -> torch.Tensor:
    """What rank 0 must hold after `op`, knowing rank r's input is rank 0's plus r."""
    x = inp.float()
    if op == "all_gather":
        return torch.cat([x + r for r in range(ranks)])
    if op == "reduce_scatter":
        return (x * ranks + sum(range(ranks)))[: x.numel() // ranks]
    if op == "all_reduce":
        return x * ranks + sum(range(ranks))
    chunk = x.numel() // ranks
    return torch.cat([x[:chunk] + r for r in range(ranks)])


def _worker(rank: int, ranks: int, port: int, kind: str, shapes: list[dict[str, Any]],
            repeats: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = f"cuda:{rank}" if kind == "cuda" else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(BACKEND[kind], rank=rank, world_size=ranks)
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    try:
        for op in dict.fromkeys(s["op"] for s in shapes):  # check each op before timing it
            call, inp, out = _collective(op, 4096 * ranks, ranks, dev)
            call()
            sync()
            ok = torch.tensor([rank != 0 or torch.allclose(
                out.float().cpu(), _expected(op, inp.cpu(), ranks), rtol=1e-2)], device=dev)
            dist.broadcast(ok, src=0)  # every rank stops when rank 0 saw a wrong result
            if not bool(ok):
                if rank == 0:
                    queue.put(("error", f"{op} over {BACKEND[kind]} gave a wrong result"))
                return
        for i, s in enumerate(shapes):
            call, _, _ = _collective(s["op"], s["nbytes"], ranks, dev)
            for _ in range(2):
                call()
            samples = []
            for _ in range(repeats):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64,
                                    device=dev)  # NCCL reduces device tensors only
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                samples.append(float(took))
            if rank == 0:
                queue.put(("row", i, summarize(samples)))
    finally:
        dist.destroy_process_group()


def _join(procs: Any) -> None:
    while not procs.join():
        pass


def run(shapes: list[CommShape], dev: Device, timer: Any,
        tick: Callable[[], bool], repeats: int = 10) -> list[dict[str, Any]]:
    """One row per shape of the NCCL-layout table (latency of the slowest rank, ms)."""
    if not shapes:
        return []
    ranks = shapes[0].ranks
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = mp.start_processes(_worker, args=(ranks, _free_port(), dev.kind,
                                              [asdict(s) for s in shapes], repeats, queue),
                               nprocs=ranks, join=False, start_method="spawn")
    got: dict[int, Any] = {}
    while len(got) < len(shapes):
        if not any(p.is_alive() for p in procs.processes) and queue.empty():
            break
        try:
            msg = queue.get(timeout=1.0)
        except Exception:  # queue.Empty: the ranks are still working
            continue
        if msg[0] == "error":
            _join(procs)
            raise KernelMismatch(msg[1])
        got[msg[1]] = msg[2]
        tick()  # the ranks run every shape; a spent time budget stops the next family
    _join(procs)
    if len(got) < len(shapes):
        raise RuntimeError(f"collective benchmark ranks exited after {len(got)} of "
                           f"{len(shapes)} shapes")
    return [{"op_name": s.op, "kernel_source": BACKEND[dev.kind], "nccl_dtype": "bfloat16",
             "num_gpus": s.ranks, "message_size": s.nbytes, **got[i].columns()}
            for i, s in enumerate(shapes)]
