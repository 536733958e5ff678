"""HTTP server (FastAPI + uvicorn) speaking SGLang's subset: /health /generate /flush_cache /server_info /metrics.

The model loads and warms up in a background thread; /health answers 503 until that is done; if it cannot load,
the server exits 1 (the traceback in its log). Concurrent requests are batched by the engine's scheduler thread
(up to --max-running-requests at once); a client that goes away (streaming or not) cancels its generation,
which leaves the batch at the next step, so /flush_cache, which answers 400 while a request waits or runs,
works again right after. Requests are checked as SGLang does
(`_parse_sampling`): a bad field is a 400 naming it, and the keep-alive connection stays open.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from .engine import Cancelled, Engine, RequestError, SamplingParams

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


SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "ignore_eos", "stop", "sampling_seed")
# SGLang sampling params this engine does not implement: accepted only at SGLang's defaults
SGLANG_DEFAULTS = {"top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                   "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1}
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1  # SGLang's sampling_seed range


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _parse_sampling(raw) -> SamplingParams:
    """SGLang's checks (SamplingParams.verify), with no coercion: "3" or 2.9 is not an integer, "false" not a bool.
    `max_new_tokens` None means up to the context length (filled in by `_fill_max_new_tokens`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RequestError("sampling_params must be an object (a batch in one body is not supported: send "
                           "concurrent requests)")
    for key, value in raw.items():
        if key in SAMPLING_KEYS or (key in SGLANG_DEFAULTS and (value is None or (
                not isinstance(value, bool) and value == SGLANG_DEFAULTS[key]))):
            continue
        allowed = ", ".join(SAMPLING_KEYS) + "; at SGLang's defaults only: " + \
            ", ".join(f"{k}={v}" for k, v in SGLANG_DEFAULTS.items())
        raise RequestError(f"sampling_params.{key}={value!r} is not supported by the reference engine; "
                           f"allowed: {allowed}")
    n = raw.get("max_new_tokens", 128)
    if n is not None and not (_is_int(n) and n >= 1):
        raise RequestError(f"sampling_params.max_new_tokens must be an integer >= 1, got {n!r}")
    temperature = raw.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not (_is_number(temperature) and temperature >= 0):
        raise RequestError(f"sampling_params.temperature must be a non-negative finite number, got {temperature!r}")
    top_p = raw.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not (_is_number(top_p) and 0 < top_p <= 1):
        raise RequestError(f"sampling_params.top_p must be in (0, 1], got {top_p!r}")
    if top_p < 1 and temperature > 0:
        raise RequestError(f"sampling_params.top_p={top_p!r}: the reference engine samples from the whole "
                           "distribution; allowed: top_p=1, or temperature=0 (greedy)")
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(f"sampling_params.ignore_eos must be true or false, got {ignore_eos!r}")
    stop = raw.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(f"sampling_params.stop must be a string or a list of strings, got {raw.get('stop')!r}")
    seed = raw.get("sampling_seed")
    if seed is not None and not (_is_int(seed) and SEED_MIN <= seed <= SEED_MAX):
        raise RequestError(f"sampling_params.sampling_seed must be an integer in [-2**63, 2**63 - 1], got {seed!r}")
    return SamplingParams(max_new_tokens=n, temperature=float(temperature), ignore_eos=ignore_eos, stop=stop,
                          sampling_seed=seed)


def _fill_max_new_tokens(params: SamplingParams, input_ids: list[int], engine: Engine) -> None:
    if params.max_new_tokens is None:  # SGLang: generate up to the context length
        params.max_new_tokens = max(1, engine.context_length - len(input_ids))


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
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        raise RequestError("input_ids must be a list of ints (a batch in one body is not supported: send concurrent "
                           "requests)")
    return ids


def _metrics_text(engine: Engine | None, model_name: str) -> str:
    st = engine.stats if engine else None
    label = f'{{model_name="{model_name}"}}'
    rows = [
        ("sglang:prompt_tokens_total", "counter", "Prompt tokens processed", st.prompt_tokens if st else 0),
        ("sglang:generation_tokens_total", "counter", "Generated tokens", st.generation_tokens if st else 0),
        ("sglang:cached_tokens_total", "counter", "Prefix-cache hit tokens (no prefix cache: 0)", 0),
        ("sglang:num_requests_total", "counter", "Finished requests", st.num_requests if st else 0),
        ("sglang:spec_verify_calls_total", "counter", "Speculative verify forwards", st.spec_verify_calls if st else 0),
        ("sglang:spec_accept_length", "gauge", "Tokens committed per verify step since start",
         engine.avg_spec_accept_length() if engine else 0.0),
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
                "avg_spec_accept_length": engine.avg_spec_accept_length() if engine else 0.0,
                "spec_verify_calls": engine.stats.spec_verify_calls if engine else 0,
                "num_requests": engine.stats.num_requests if engine else 0,
                "effective_max_running_requests_per_dp": state.args.max_running_requests,
            }],
        })
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
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            input_ids = _parse_prompt(body, engine)
            params = _parse_sampling(body.get("sampling_params"))
            _fill_max_new_tokens(params, input_ids, engine)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestError(f"stream must be true or false, got {stream!r}")
            engine.check(input_ids, params)
        except json.JSONDecodeError as exc:
            return _error(400, f"malformed JSON: {exc}")
        except RequestError as exc:
            return _error(400, str(exc))
        if stream:
            return StreamingResponse(_stream(engine, input_ids, params), media_type="text/event-stream")
        cancel = threading.Event()
        watcher = asyncio.create_task(_cancel_on_disconnect(request, cancel))
        try:
            out = await run_in_threadpool(engine.generate, input_ids, params, None, cancel)
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
        return JSONResponse({"text": engine.decode(out.output_ids), "output_ids": out.output_ids,
                             "meta_info": out.meta_info})

    return app


async def _cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Sets `cancel` when the client closes the connection (the body is read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


async def _stream(engine: Engine, input_ids: list[int], params: SamplingParams):
    """SGLang SSE: `data: {json}\\n\\n` per step (cumulative text and output_ids), then `data: [DONE]`.
    A client that goes away closes this generator (Starlette), which cancels the generation."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()
    t0 = time.perf_counter()

    def on_tokens(ids):
        loop.call_soon_threadsafe(queue.put_nowait, ("step", list(ids)))

    def work():
        try:
            out = engine.generate(input_ids, params, on_tokens, cancel)
            loop.call_soon_threadsafe(queue.put_nowait, ("done", out))
        except Cancelled as exc:
            logger.info("streamed generation cancelled: %s", exc)
            loop.call_soon_threadsafe(queue.put_nowait, ("error", str(exc)))
        except Exception as exc:  # reported in-band: the status line is already sent
            logger.exception("streamed generation failed")
            loop.call_soon_threadsafe(queue.put_nowait, ("error", f"{type(exc).__name__}: {exc}"))

    threading.Thread(target=work, daemon=True).start()
    try:
        while True:
            kind, payload = await queue.get()
            if kind == "step":
                chunk = {"text": engine.decode(payload), "output_ids": payload,
                         "meta_info": {"prompt_tokens": len(input_ids), "completion_tokens": len(payload),
                                       "finish_reason": None, "e2e_latency": time.perf_counter() - t0}}
            elif kind == "done":
                chunk = {"text": engine.decode(payload.output_ids), "output_ids": payload.output_ids,
                         "meta_info": payload.meta_info}
            else:
                chunk = {"error": {"message": payload}}
            yield f"data: {json.dumps(chunk)}\n\n"
            if kind != "step":
                break
        yield "data: [DONE]\n\n"
    finally:
        cancel.set()  # finished: no effect; the client went away: the generation stops at its next step


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
