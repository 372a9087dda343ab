"""A stand-in for `vllm serve` in the local backend's fast tests: an OpenAI-like HTTP server.

`fake_vllm.py serve MODEL ... --port N` answers /health, /v1/models and /v1/completions (JSON,
or server-sent events when streaming) like vLLM, and starts one child process in its own
process group, as vLLM's engine core does. Behaviour switches:
- an argument `--no-such-flag`: print vLLM's usage error and exit 2;
- FAKE_VLLM_DELAY_S: seconds before the server listens (default 0);
- FAKE_VLLM_STUBBORN=1: the child ignores SIGTERM (teardown has to SIGKILL it).

`fake_vllm.py bench serve ... --save-result --result-dir D --result-filename F` writes a result
JSON shaped like vLLM's (fixed figures, see BENCH_RESULT) and prints its arguments;
FAKE_VLLM_BENCH_FAIL=1 makes it fail instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from aiohttp import web

CHILD = ("import signal, sys, time\n"
         "if sys.argv[1] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "time.sleep(600)\n")


BENCH_RESULT = {
    "completed": 8, "failed": 0, "duration": 2.0, "request_throughput": 4.0,
    "total_input_tokens": 512, "total_output_tokens": 128,
    "output_throughput": 64.0, "total_token_throughput": 320.0,
    "mean_ttft_ms": 110.0, "median_ttft_ms": 100.0, "p50_ttft_ms": 100.0, "p90_ttft_ms": 150.0,
    "p99_ttft_ms": 200.0, "mean_tpot_ms": 11.0, "median_tpot_ms": 10.0, "p50_tpot_ms": 10.0,
    "p90_tpot_ms": 12.0, "p99_tpot_ms": 14.0, "mean_itl_ms": 11.0, "median_itl_ms": 10.0,
    "p50_itl_ms": 10.0, "p90_itl_ms": 13.0, "p99_itl_ms": 20.0, "mean_e2el_ms": 300.0,
}


def bench(argv: list[str]) -> int:
    print("fake vllm bench " + " ".join(argv), flush=True)
    if os.environ.get("FAKE_VLLM_BENCH_FAIL") == "1":
        print("RuntimeError: server at the base url refused the connection", flush=True)
        return 1
    out = os.path.join(argv[argv.index("--result-dir") + 1],
                       argv[argv.index("--result-filename") + 1])
    with open(out, "w") as f:
        json.dump({**BENCH_RESULT, "num_prompts": int(argv[argv.index("--num-prompts") + 1])}, f)
    return 0


def main(argv: list[str]) -> int:
    if argv[:2] == ["bench", "serve"]:
        return bench(argv[2:])
    if "--no-such-flag" in argv:
        print("usage: vllm serve [model_tag] [options]", file=sys.stderr)
        print("vllm serve: error: unrecognized arguments: --no-such-flag", file=sys.stderr)
        return 2
    model, port = argv[1], int(argv[argv.index("--port") + 1])
    stubborn = os.environ.get("FAKE_VLLM_STUBBORN") == "1"
    child = subprocess.Popen([sys.executable, "-c", CHILD, "1" if stubborn else "0"])
    print(f"fake vllm serving {model} on {port}, engine pid {child.pid}", flush=True)
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY_S", "0")))

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        print(f"completion max_tokens={body.get('max_tokens')} "
              f"kv={json.dumps(body.get('kv_transfer_params'))}", flush=True)
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "ok"}],
                                      "kv_transfer_params": {"remote_port": port}})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b'data: {"choices": [{"text": "ok"}]}\n\ndata: [DONE]\n\n')
        await out.write_eof()
        return out

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    web.run_app(app, host="127.0.0.1", port=port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
