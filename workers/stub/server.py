"""A simulation engine for scheduling tests and benchmarks (`engine.kind=stub`): no model, real seam.

It is started by the real `EngineProcess` with SGLang's flag names, answers the seam's HTTP API
(`/health`, `/generate` with valid `meta_info`, `/flush_cache`, `/server_info`, `/metrics` with the requests
running and finished, in SGLang's names) and takes time like an engine: prefill `--stub-prefill-s` per prompt
token, decode `--stub-token-s` per generated token. Its tokens are dummies (the reference engine's byte
tokenizer, a fixed sentence); with speculation every verify step commits `--speculative-num-steps + 1` tokens,
as the oracle drafter would. So it measures the orchestrator (placement, queueing, retries, tracking), never a
model: do not read its metrics as results.

Multi-node (`--nnodes N --node-rank i --dist-init-addr host:port`): rank 0 listens on the dist-init address
and becomes healthy only once every other rank has connected to it; ranks > 0 serve no HTTP, connect to
rank 0, and exit when rank 0 goes away (as a torch.distributed peer would fail).

Each process logs one start-up line first, as SGLang logs its server args (`log_start`): its pid, rank, the
rendezvous address, CUDA_VISIBLE_DEVICES and the Ray node id the runner gave it (SPECSWEEP_NODE_ID); no other
environment value, so no secret, reaches the engine log.

    python -m workers.stub.server --port 30000 --stub-token-s 0.01 [SGLang flags...]
    python -m orchestrator engine=stub engine.stub.token_s=0.01        # through the orchestrator (conf/engine/stub.yaml)
    tools.testing.stub_server(tp_size=8, nnodes=1, token_s=0.005, seed=0) -> ServerSpec   # tests, benches

Its timing flags are `specsweep_common.spec.StubOptions` (`engine.stub.*` in the config), emitted by `StubOptions.argv()`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specsweep_common.spec import ProbeSpec, StubOptions

SENTENCE = ProbeSpec.sentence.encode()  # the predictable probe's default text, as bytes
CHARS_PER_TOKEN = 4  # text prompts (no input_ids): a rough token count, as the probe assumes
# tools/bench_regress.py only: the token time multiplied by this factor, a slower build that no flag, config or grid
# point shows (what the regression check must catch on exactly the points this engine serves).
ENV_BENCH_SLOWDOWN = "SPECSWEEP_BENCH_STUB_SLOWDOWN"

logger = logging.getLogger("stub_engine")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=0)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    p.add_argument("--stub-startup-s", type=float, default=StubOptions.startup_s, help="seconds before /health answers 200")
    p.add_argument("--stub-prefill-s", type=float, default=StubOptions.prefill_s, help="seconds per prompt token")
    p.add_argument("--stub-token-s", type=float, default=StubOptions.token_s, help="seconds per generated token")
    p.add_argument("--stub-rendezvous-timeout-s", type=float, default=StubOptions.rendezvous_timeout_s)
    args, _ = p.parse_known_args(argv)  # the rest of SGLang's flags mean nothing to a stub
    return args


def log_start(args: argparse.Namespace) -> None:
    logger.info("started pid=%d node_rank=%d nnodes=%d tp_size=%d dist_init_addr=%s CUDA_VISIBLE_DEVICES=%s "
                "node_id=%s", os.getpid(), args.node_rank, args.nnodes, args.tp_size, args.dist_init_addr,
                os.environ.get("CUDA_VISIBLE_DEVICES", ""), os.environ.get("SPECSWEEP_NODE_ID", ""))


# ---------------------------------------------------------------- multi-node rendezvous


def _split_addr(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def wait_for_peers(addr: str, nnodes: int, timeout_s: float) -> list[socket.socket]:
    """Rank 0: accept one connection from each other rank; returns them (kept open)."""
    srv = socket.create_server(_split_addr(addr), reuse_port=False)
    srv.settimeout(timeout_s)
    peers: list[socket.socket] = []
    while len(peers) < nnodes - 1:
        conn, _ = srv.accept()
        rank = int(conn.recv(16).decode().strip() or -1)
        logger.info("rank %d joined", rank)
        peers.append(conn)
    srv.close()
    return peers


def join_rank0(addr: str, rank: int, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection(_split_addr(addr), timeout=5)
            conn.sendall(f"{rank}\n".encode())
            conn.settimeout(None)
            return conn
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---------------------------------------------------------------- HTTP


class StubState:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.ready = False
        self.lock = threading.Lock()
        self.running = 0  # /generate requests in flight
        self.finished = 0
        self.speculative = bool(args.speculative_algorithm) and args.speculative_algorithm != "NONE"


def _meta(state: StubState, prompt_tokens: int, n: int, e2e: float, ttft: float) -> dict:
    meta = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "cached_tokens": 0, "e2e_latency": e2e,
            "ttft": ttft, "finish_reason": {"type": "length", "length": n}}
    if state.speculative and n > 1:
        commit = state.args.speculative_num_steps + 1
        steps, left = [], n - 1  # the first token comes from prefill
        while left > 0:
            c = min(commit, left)
            steps.append({"accept_len": c, "tree_depth": state.args.speculative_num_steps,
                          "tree_nodes": commit, "verify_s": state.args.stub_token_s * c})
            left -= c
        meta.update(spec_steps=steps, spec_verify_ct=len(steps),
                    spec_accept_length=n / len(steps),  # SGLang's: completion_tokens / spec_verify_ct
                    spec_num_correct_drafts=sum(s["accept_len"] - 1 for s in steps),
                    spec_num_proposed_drafts=len(steps) * state.args.speculative_num_steps)
    return meta


def _logprobs(out_ids: list[int], top: int) -> dict:
    """SGLang's logprob fields in its answer shape (sglang/srt/managers/tokenizer_manager.py:2868-2872, 2960-2972),
    with simulated values: the emitted token first at logprob -0.1, then the next bytes, 1.0 apart."""
    meta: dict = {"input_token_logprobs": [], "output_token_logprobs": [[-0.1, t, None] for t in out_ids],
                  "output_token_logprobs_length": len(out_ids)}
    if top > 0:
        meta.update(input_top_logprobs=[], output_top_logprobs=[
            [[-0.1 - j, (t + j) % 256, None] for j in range(top)] for t in out_ids])
    return meta


def make_handler(state: StubState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):  # quiet: one line per request would flood the engine log
            pass

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._json(200 if state.ready else 503, {"ready": state.ready})
            elif self.path == "/server_info":
                self._json(200, {"engine": "stub", "tp_size": state.args.tp_size, "nnodes": state.args.nnodes})
            elif self.path == "/metrics":
                data = (f"sglang:num_running_reqs {state.running}\n"  # SGLang's names (one name per quantity)
                        f"sglang:num_requests_total {state.finished}\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._json(404, {"error": self.path})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/flush_cache":
                self._json(200, {"flushed": True})
            elif self.path == "/generate":
                self._generate(body)
            else:
                self._json(404, {"error": self.path})

        def _generate(self, body: dict) -> None:
            with state.lock:
                state.running += 1
            try:
                self._respond(body)
            finally:
                with state.lock:
                    state.running -= 1
                    state.finished += 1

        def _respond(self, body: dict) -> None:
            t0 = time.perf_counter()
            ids = body.get("input_ids")
            prompt_tokens = len(ids) if ids is not None else max(1, len(body.get("text") or "") // CHARS_PER_TOKEN)
            n = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
            out_ids = [SENTENCE[i % len(SENTENCE)] for i in range(n)]
            text = bytes(out_ids).decode()
            time.sleep(prompt_tokens * state.args.stub_prefill_s + state.args.stub_token_s)
            ttft = time.perf_counter() - t0
            time.sleep(max(0, n - 1) * state.args.stub_token_s)
            e2e = time.perf_counter() - t0
            meta = _meta(state, prompt_tokens, n, e2e, ttft)
            if body.get("return_logprob") is True:
                meta.update(_logprobs(out_ids, body.get("top_logprobs_num") or 0))
            final = {"text": text, "output_ids": out_ids, "meta_info": meta}
            if not body.get("stream"):
                self._json(200, final)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            first = {"text": text[:1], "output_ids": out_ids[:1],
                     "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": 1}}
            for chunk in (first, final):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s stub: %(message)s")
    args = parse_args(argv)
    if slowdown := os.environ.get(ENV_BENCH_SLOWDOWN):
        args.stub_token_s *= float(slowdown)
        logger.info("%s=%s: token time %g s", ENV_BENCH_SLOWDOWN, slowdown, args.stub_token_s)
    log_start(args)
    if args.nnodes > 1 and args.node_rank > 0:
        conn = join_rank0(args.dist_init_addr, args.node_rank, args.stub_rendezvous_timeout_s)
        logger.info("rank %d of %d joined %s", args.node_rank, args.nnodes, args.dist_init_addr)
        conn.recv(1)  # blocks until rank 0 closes or dies
        logger.info("rank 0 went away; exiting")
        return 1
    state = StubState(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    peers = []
    if args.nnodes > 1:
        peers = wait_for_peers(args.dist_init_addr, args.nnodes, args.stub_rendezvous_timeout_s)
    time.sleep(args.stub_startup_s)
    state.ready = True
    logger.info("serving on %s:%d (nnodes=%d, peers=%d)", args.host, args.port, args.nnodes, len(peers))
    threading.Event().wait()  # until SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
