"""HTTP server (FastAPI + uvicorn) speaking SGLang's subset: /health /generate /flush_cache /server_info /metrics,
and the OpenAI-compatible routes of `openai_api` (/v1/models, /v1/completions, /v1/chat/completions, /model_info).

The model loads and warms up in a background thread; /health answers 503 until that is done; if it cannot load,
the server exits 1 (the traceback in its log). Concurrent requests are batched by the engine's scheduler thread
(up to --max-running-requests at once); a client that goes away (streaming or not) cancels its generation,
which leaves the batch at the next step, so /flush_cache, which answers 400 while a request waits or runs,
works again right after. Requests are checked as SGLang does
(`request_params.parse_sampling`): a bad field is a 400 naming it, and the keep-alive connection stays open. A
/generate body follows SGLang 0.5.23's contract (`request_params.check_generate_fields`): an unknown top-level key
is ignored, an unknown sampling_params key is a 400, and an SGLang field this engine does not serve is a 400 unless
at its default.
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from specsweep_common.sglang_facts import FORWARD_SECONDS, GENERATION_TOKENS, VERIFY_CALLS, VERIFY_CATEGORY

from .request_params import (cancel_on_disconnect, fill_max_new_tokens, is_int, parse_json_body, parse_logprob,
                             parse_sampling)
from .engine import Cancelled, Engine, RequestError, SamplingParams
from .openai_api import add_openai_routes, engine_events
from .request_export import RequestExport
from .request_params import check_generate_fields

logger = logging.getLogger(__name__)

VERSION = "specsweep-reference 0.1.0"


class ServerState:
    def __init__(self, args):
        self.args = args
        self.engine: Engine | None = None
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.start_time = time.time()
        self.server = None  # the uvicorn server: told to exit when the engine cannot load

    def load(self) -> None:
        """Build the engine and run one warm-up generation (stats are reset after it)."""
        try:
            t0 = time.perf_counter()
            engine = Engine(self.args)
            engine.generate(list(range(1, 9)), SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))
            engine.stats = type(engine.stats)()
            if self.args.export_metrics_to_file:  # after the warm-up: only the clients' requests are written
                engine.request_export = RequestExport(self.args.export_metrics_to_file_dir)
            self.engine = engine
            self.ready.set()
            logger.info("engine ready in %.1f s (model %s, algorithm %s)", time.perf_counter() - t0,
                        self.args.model_path, engine.algorithm)
        except Exception as exc:  # exit 1 with the traceback in the log, as SGLang does
            self.load_error = f"{type(exc).__name__}: {exc}"
            logger.exception("engine failed to load; exiting")
            if self.server is not None:
                self.server.should_exit = True


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def _parse_prompt(body: dict, engine: Engine) -> list[int]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("give exactly one of text or input_ids")
    if text is not None:
        if not isinstance(text, str):
            raise RequestError("text must be a string (a batch in one body is not supported: send concurrent "
                               "requests)")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"text is not valid Unicode: {exc.reason} {text[exc.start:exc.end]!r} at "
                               f"character {exc.start}") from exc
        return engine.encode(text)
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise RequestError("input_ids must be a list of ints (a batch in one body is not supported: send concurrent "
                           "requests)")
    return ids


def _metrics_text(engine: Engine | None, model_name: str) -> str:
    st = engine.stats if engine else None
    label = f'{{model_name="{model_name}"}}'
    rows = [
        ("sglang:prompt_tokens_total", "counter", "Prompt tokens processed", st.prompt_tokens if st else 0),
        (GENERATION_TOKENS, "counter", "Generated tokens", st.generation_tokens if st else 0),
        ("sglang:cached_tokens_total", "counter", "Prefix-cache hit tokens (no prefix cache: 0)", 0),
        ("sglang:num_requests_total", "counter", "Finished requests", st.num_requests if st else 0),
        (VERIFY_CALLS, "counter", "Speculative verify forwards", st.spec_verify_calls if st else 0),
        ("sglang:spec_accept_length", "gauge", "Tokens committed per verify step in the last complete "
         "--decode-log-interval window", engine.accept_window.last if engine else 0.0),
        ("sglang:num_running_reqs", "gauge", "Requests running", len(engine.running) if engine else 0),
        ("sglang:num_queue_reqs", "gauge", "Requests waiting", len(engine.waiting) if engine else 0),
        ("sglang:e2e_request_latency_seconds_sum", "counter", "Sum of end-to-end latencies", st.e2e_seconds if st else 0.0),
        ("sglang:e2e_request_latency_seconds_count", "counter", "Requests timed", st.num_requests if st else 0),
        ("sglang:time_to_first_token_seconds_sum", "counter", "Sum of times to first token", st.ttft_seconds if st else 0.0),
        ("sglang:time_to_first_token_seconds_count", "counter", "Requests timed", st.num_requests if st else 0),
    ]
    lines = []
    for name, kind, help_, value in rows:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
    # SGLang's device-timer counter, with its scheduler labels and category (sglang/srt/observability/
    # metrics_collector.py:1054-1061, 1382-1387): seconds of batched verify forwards (workers/engine_counters.py)
    name = FORWARD_SECONDS
    fwd = (f'{{model_name="{model_name}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",'
           f'category="{VERIFY_CATEGORY}"}}')
    lines += [f"# HELP {name} Seconds of target-verify forwards (host clock)", f"# TYPE {name} counter",
              f"{name}{fwd} {st.verify_forward_seconds if st else 0.0}"]
    return "\n".join(lines) + "\n"


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        import anyio.to_thread

        # a non-streamed /generate waits in one of Starlette's worker threads (40 by default): enough for every
        # request the engine may batch, plus the short calls (/flush_cache)
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, state.args.max_running_requests + 8)
        yield
        if state.engine is not None:
            state.engine.cancelled.set()  # let a running generation stop at its next step

    app = FastAPI(title="specsweep reference engine", version=VERSION, lifespan=lifespan)
    model_name = state.args.served_model_name or state.args.model_path
    add_openai_routes(app, state, model_name)  # /v1/models, /v1/completions, /v1/chat/completions, /model_info

    @app.get("/health")
    @app.get("/health_generate")
    @app.get("/ready")
    async def health():
        if state.ready.is_set():
            return Response(status_code=200)
        return _error(503, state.load_error or "starting: loading the model and warming up")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        if not state.ready.is_set():
            return _error(503, "not ready")
        if state.engine.num_active():
            return _error(400, "cannot flush the cache while a request is running")
        try:
            await run_in_threadpool(state.engine.flush_cache)
        except RequestError as exc:  # a request arrived meanwhile
            return _error(400, str(exc))
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info():
        engine = state.engine
        info = dict(vars(state.args))
        info.update({
            "version": VERSION, "engine": "specsweep-reference", "startup_time": state.start_time,
            "ready": state.ready.is_set(), "max_batch_size": state.args.max_running_requests,
            "context_length": engine.context_length if engine else state.args.context_length,
            "internal_states": [{
                "spec_verify_calls": engine.stats.spec_verify_calls if engine else 0,
                "num_requests": engine.stats.num_requests if engine else 0,
                "effective_max_running_requests_per_dp": state.args.max_running_requests,
            }],
        })
        if engine is not None:  # SGLang's scheduler limits, same meaning (sglang/srt/managers/scheduler.py:1942-1947)
            info.update(max_req_input_len=engine.max_req_input_len, max_total_num_tokens=engine.max_total_num_tokens)
        accept_length = engine.avg_spec_accept_length() if engine else None
        if accept_length is not None:  # as SGLang: complete windows since the last flush, else no key (spec_counters)
            info["internal_states"][0]["avg_spec_accept_length"] = accept_length
        return JSONResponse(info)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(_metrics_text(state.engine, model_name),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/generate")
    async def generate(request: Request):
        engine = state.engine  # set before `ready`
        if not state.ready.is_set() or engine is None:
            return _error(503, state.load_error or "not ready: the model is loading")
        try:
            body = parse_json_body(await request.body())
            check_generate_fields(body)
            input_ids = _parse_prompt(body, engine)
            params = parse_sampling(body.get("sampling_params"))
            fill_max_new_tokens(params, input_ids, engine)
            top_logprobs = parse_logprob(body, len(input_ids), engine.config.vocab_size)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(f"stream must be true or false, got {stream!r}")
            engine.check(input_ids, params)
        except RequestError as exc:
            return _error(400, str(exc))
        except RecursionError:  # a value nested too deep to check or to quote in a message
            return _error(400, "the body's JSON is nested too deep")
        except (ValueError, OverflowError) as exc:  # a value the checks above could not convert
            return _error(400, f"bad request: {exc}")
        if stream:
            return StreamingResponse(_stream(engine, input_ids, params, top_logprobs), media_type="text/event-stream")
        cancel = threading.Event()
        watcher = asyncio.create_task(cancel_on_disconnect(request, cancel))
        try:
            out = await run_in_threadpool(engine.generate, input_ids, params, None, cancel, top_logprobs)
        except RequestError as exc:
            return _error(400, str(exc))
        except Cancelled as exc:
            logger.info("generation cancelled: %s", exc)
            return _error(503, str(exc))
        except Exception as exc:
            logger.exception("generation failed")
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}")
        finally:
            watcher.cancel()
        return JSONResponse({"text": engine.output_text(out, params), "output_ids": out.output_ids,
                             "meta_info": out.meta_info})

    return app


async def _stream(engine: Engine, input_ids: list[int], params: SamplingParams, top_logprobs: int | None = None):
    """SGLang SSE: `data: {json}\\n\\n` per step (cumulative text and output_ids), then `data: [DONE]`. Logprobs
    (`top_logprobs` not None) are in the last chunk's meta_info only, all of them (SGLang sends them in every
    chunk, accumulated: its last chunk has the same).
    A client that goes away closes this generator (Starlette), which cancels the generation."""
    t0 = time.perf_counter()
    events = engine_events(engine, input_ids, params, top_logprobs)  # its thread; cancelled when this closes
    try:
        async for kind, payload in events:
            if kind == "step":
                chunk = {"text": engine.decode(payload), "output_ids": payload,
                         "meta_info": {"prompt_tokens": len(input_ids), "completion_tokens": len(payload),
                                       "finish_reason": None, "e2e_latency": time.perf_counter() - t0}}
            elif kind == "done":
                chunk = {"text": engine.output_text(payload, params), "output_ids": payload.output_ids,
                         "meta_info": payload.meta_info}
            else:
                chunk = {"error": {"message": payload}}
            yield f"data: {json.dumps(chunk)}\n\n"
            if kind != "step":
                break
        yield "data: [DONE]\n\n"
    finally:
        await events.aclose()  # finished: no effect; the client went away: the generation stops at its next step


def run_server(args) -> None:
    import uvicorn

    state = ServerState(args)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if state.engine is not None:
                state.engine.cancelled.set()  # a running generation stops at its next step
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if sig == signal.SIGTERM and captured and sig in captured:
                captured.remove(sig)  # SIGTERM is the normal way to stop: exit 0 once shut down

    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5)
    state.server = Server(config)
    threading.Thread(target=state.load, name="engine-load", daemon=True).start()
    state.server.run()
    if state.load_error is not None:
        raise SystemExit(1)
