"""The reference engine's OpenAI-compatible routes, shaped as SGLang 0.5.23 serves them, so that SGLang's own
clients (bench_serving `--backend sglang-oai` / `sglang-oai-chat`, and its readiness check) work unchanged.

    GET  /v1/models, /v1/models/{model}     ModelList / ModelCard (sglang/srt/entrypoints/http_server.py:1993-2047)
    GET  /model_info, /get_model_info       http_server.py:802-850; `tokenizer_path` loads offline (tokenizer_export)
    POST /v1/completions                    serving_completions.py (CompletionRequest, protocol.py:365)
    POST /v1/chat/completions               serving_chat.py (ChatCompletionRequest, protocol.py:909)

Responses carry SGLang's keys: `usage` (UsageInfo, protocol.py:221-229; no speculative fields there in SGLang
either), `metadata.weight_version`, and with `return_spec_tokens_details` the per-request speculative counts in
`sglext.spec_tokens_details` (SpecTokensDetails, protocol.py:456-467, built as utils.py:310-341 builds it from
meta_info); chat with `return_meta_info` (non-streamed only, serving_chat.py:1321-1325) returns the whole native
meta_info in `choices[0].meta_info`. Streams are `data: {json}\\n\\n` events ending with `data: [DONE]`; usage comes
in a last chunk with `choices: []` only when `stream_options.include_usage` (utils.py:250-264;
`stream_response_default_include_usage` is False). Errors are SGLang's ErrorResponse (protocol.py:106-111).

Differences from SGLang: one prompt per request (n=1, no prompt batches: send concurrent requests); no logprobs,
tools, constrained decoding or reasoning parser (a non-default value is a 400 naming the field); a streamed
completion's finish_reason comes in a chunk of its own, with empty text, after the last text chunk (the engine's
per-step callback does not say which step is the last); a stream holds back trailing U+FFFD (an incomplete UTF-8
character) until more tokens or the end arrive, where SGLang also holds back the last word; before the model has
loaded these routes answer 503 (SGLang does not listen yet).
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from .chat_template import ChatTemplateError, load_chat_template, render_chat
from .engine import Cancelled, Engine, Output, RequestError, SamplingParams
from .finish import trim_matched_stop
from .request_params import cancel_on_disconnect, fill_max_new_tokens, is_int, parse_json_body, parse_sampling
from .tokenizer_export import hf_tokenizer_dir

logger = logging.getLogger(__name__)

OWNED_BY = "specsweep-reference"  # ModelCard.owned_by; SGLang says "sglang" (protocol.py:93)
# meta_info keys SGLang copies into sglext.spec_tokens_details (utils.py:316-326), with their defaults
SPEC_DETAIL_DEFAULTS: dict[str, Any] = {
    "spec_accept_rate": 0.0, "spec_accept_length": 0.0, "spec_cap_length": 0.0, "spec_block_accept_length": 0.0,
    "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0, "spec_verify_ct": 0,
    "spec_correct_drafts_histogram": [], "spec_cap_lens_histogram": []}
# request fields of CompletionRequest / ChatCompletionRequest this engine does not implement: accepted only at
# their default (or null). Fields SGLang's protocol does not know are ignored, as pydantic ignores them there.
UNSUPPORTED_COMMON = {"logit_bias": None, "response_format": None, "regex": None, "ebnf": None,
                      "json_schema": None, "stop_token_ids": None, "stop_regex": None,
                      "skip_special_tokens": True, "lora_path": None, "return_hidden_states": False,
                      "return_routed_experts": False, "custom_logit_processor": None, "return_token_ids": False}
UNSUPPORTED_COMPLETION = {**UNSUPPORTED_COMMON, "best_of": 1, "logprobs": None, "suffix": None}
UNSUPPORTED_CHAT = {**UNSUPPORTED_COMMON, "logprobs": False, "top_logprobs": None, "tools": None,
                    "continue_final_message": False, "return_prompt_token_ids": False}  # no tools: tool_choice moot
# OpenAI name -> native sampling key (serving_completions.py:151-175, protocol.py:1212-1236); the rest keep their name
RENAMED = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens", "seed": "sampling_seed",
           "min_tokens": "min_new_tokens"}
PASSED = ("temperature", "top_p", "stop", "ignore_eos", "top_k", "min_p", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "n", "no_stop_trim")


def error_response(status: int, message: str, err_type: str = "BadRequestError") -> JSONResponse:
    """SGLang's ErrorResponse body (protocol.py:106-111, serving_base.py create_error_response)."""
    return JSONResponse({"object": "error", "message": message, "type": err_type, "param": None, "code": status},
                        status_code=status)


def usage(meta: dict) -> dict:
    """UsageInfo from one request's meta_info (usage_processor.py:96-132; no cache report)."""
    prompt, completion = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    reasoning = meta.get("reasoning_tokens", 0)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None}


def spec_tokens_details(meta: dict) -> dict | None:
    """sglext.spec_tokens_details from meta_info, as `spec_tokens_details_from_meta_info` (utils.py:310-341):
    None when no speculative key is there (no drafter)."""
    if not any(key in meta for key in SPEC_DETAIL_DEFAULTS):
        return None
    return {key: meta.get(key) or default for key, default in SPEC_DETAIL_DEFAULTS.items()}


def check_unsupported(body: dict, table: dict[str, Any]) -> None:
    for key, default in table.items():
        value = body.get(key)
        if value is None or (value == default and isinstance(value, bool) == isinstance(default, bool)):
            continue
        raise RequestError(f"{key}={value!r} is not supported by the reference engine; allowed: {key}={default!r} "
                           "or null")


def sampling_from(body: dict, max_tokens_key: str, max_tokens_default: int | None) -> SamplingParams:
    """The request's sampling fields, renamed to SGLang's native ones and checked by `parse_sampling`."""
    raw: dict[str, Any] = {"max_new_tokens": body.get(max_tokens_key, max_tokens_default)}
    if max_tokens_key == "max_completion_tokens" and body.get("max_completion_tokens") is None:
        raw["max_new_tokens"] = body.get("max_tokens")  # chat: max_completion_tokens or max_tokens (protocol.py:1214)
    for key in (*PASSED, "seed", "min_tokens"):
        if body.get(key) is not None:
            raw[RENAMED.get(key, key)] = body[key]
    names = {native: openai for openai, native in RENAMED.items()} | {k: k for k in PASSED}
    names["max_new_tokens"] = max_tokens_key
    return parse_sampling(raw, names)


def stream_flags(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats) (utils.py:250-264, the server default being False)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(f"stream_options must be an object, got {options!r}")
    flags = [options.get("include_usage") or False, options.get("continuous_usage_stats") or False]
    if not all(isinstance(f, bool) for f in flags):
        raise RequestError(f"stream_options.include_usage / continuous_usage_stats must be booleans, got {options!r}")
    return stream, flags[0], flags[1]


def completion_prompt(prompt: Any, engine: Engine) -> tuple[list[int], str]:
    """(input ids, prompt text for `echo`) of CompletionRequest.prompt: a string or a list of token ids, or a
    one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if not prompt:
        raise RequestError("Prompt cannot be empty")  # serving_completions.py:63-69
    if isinstance(prompt, str):
        return engine.encode(prompt), prompt
    if isinstance(prompt, list) and all(is_int(t) for t in prompt):
        return list(prompt), engine.decode(prompt)
    if isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError(f"prompt: a batch of {len(prompt)} prompts is not supported by the reference engine: "
                           "send concurrent requests")
    raise RequestError("prompt must be a string, a list of token ids, or a one-element list of either")


def chat_messages(raw: Any) -> list[dict]:
    """Messages for the template: content flattened to text as SGLang does for string-format templates (text parts
    joined by a space, jinja_template_utils.py:325-336); media parts are refused (a text-only model)."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a string role")
        content = message.get("content")
        if isinstance(content, list):
            kinds = {part.get("type") if isinstance(part, dict) else None for part in content}
            if not kinds <= {"text", "input_text"}:
                raise RequestError(f"messages[{i}].content: only text parts are supported (a text-only model), got "
                                   f"types {sorted(map(str, kinds))}")
            content = " ".join(part["text"] for part in content)
        elif content is not None and not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string, a list of text parts or null")
        messages.append({**{k: v for k, v in message.items() if v is not None}, "content": content or ""})
    return messages


class TextDeltas:
    """Incremental text of a stream: each call gives what is new since the last one. Until the end, a trailing run
    of U+FFFD (an incomplete UTF-8 character) is held back, as SGLang's detokenizer does
    (detokenizer_manager.py:394-412)."""

    def __init__(self, engine: Engine, params: SamplingParams):
        self.engine, self.params, self.sent = engine, params, 0

    def __call__(self, output_ids: list[int], final: Output | None = None) -> str:
        """`final`: the finished request's Output, whose text is trimmed at its matched stop string."""
        if final is not None:
            text = trim_matched_stop(self.engine.decode(output_ids), final.meta_info.get("finish_reason"),
                                     self.params.no_stop_trim)
        else:
            text = self.engine.decode(output_ids).rstrip("\ufffd")
        delta = text[self.sent:]
        self.sent = max(self.sent, len(text))
        return delta


async def engine_events(engine: Engine, input_ids: list[int], params: SamplingParams,
                        top_logprobs_num: int | None = None):
    """Yields ("step", output ids so far) after each decode step, then ("done", Output) or ("error", message). A
    client that goes away closes this generator, which cancels the generation (it stops at its next step).
    `top_logprobs_num`: Engine.generate's (the native /generate's return_logprob)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    cancel = threading.Event()

    def work():
        try:
            out = engine.generate(input_ids, params, lambda ids: loop.call_soon_threadsafe(
                queue.put_nowait, ("step", list(ids))), cancel, top_logprobs_num)
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
            event = await queue.get()
            yield event
            if event[0] != "step":
                return
    finally:
        cancel.set()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _finish(meta: dict) -> tuple[str | None, Any]:
    reason = meta.get("finish_reason")
    return (reason["type"], reason.get("matched")) if reason else (None, None)


class OpenAIRoutes:
    """The handlers; `state` is the server's ServerState (engine, ready, load_error, args, start_time)."""

    def __init__(self, state: Any, model_name: str):
        self.state, self.model_name = state, model_name

    def engine(self) -> Engine | None:
        return self.state.engine if self.state.ready.is_set() else None

    def not_ready(self) -> JSONResponse:
        return error_response(503, self.state.load_error or "not ready: the model is loading", "ServiceUnavailable")

    def model_card(self, engine: Engine) -> dict:
        """ModelCard (protocol.py:87-96)."""
        return {"id": self.model_name, "object": "model", "created": int(self.state.start_time),
                "owned_by": OWNED_BY, "root": self.model_name, "parent": None, "max_model_len": engine.context_length}

    async def models(self) -> Response:
        engine = self.engine()
        if engine is None:
            return self.not_ready()
        return JSONResponse({"object": "list", "data": [self.model_card(engine)]})

    async def model(self, model: str) -> Response:
        engine = self.engine()
        if engine is None:
            return self.not_ready()
        if model != self.model_name:  # http_server.py:2030-2041
            return JSONResponse({"error": {"message": f"The model '{model}' does not exist",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}}, status_code=404)
        return JSONResponse(self.model_card(engine))

    async def model_info(self) -> Response:
        """http_server.py:812-850: SGLang's keys; values of this engine (a text-only, generation model)."""
        engine = self.engine()
        if engine is None:
            return self.not_ready()
        args = self.state.args
        tokenizer_path = await run_in_threadpool(hf_tokenizer_dir, args.model_path, engine.context_length)
        llama = not engine.config.qk_norm  # Qwen3 normalises q/k per head, Llama (GGUF) does not
        return JSONResponse({
            "model_path": args.model_path, "served_model_name": self.model_name, "tokenizer_path": tokenizer_path,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "load_format": args.load_format, "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": "null", "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "llama" if llama else "qwen3",
            "architectures": ["LlamaForCausalLM" if llama else "Qwen3ForCausalLM"]})

    async def completions(self, request: Request) -> Response:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, chat: bool) -> Response:
        engine = self.engine()
        if engine is None:
            return self.not_ready()
        try:
            media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media_type != "application/json":  # validate_json_request, http_server.py:695-708
                raise RequestError("Unsupported Media Type: Only 'application/json' is allowed")
            body = parse_json_body(await request.body())
            model = body.get("model", "default")  # DEFAULT_MODEL_NAME (protocol.py:84); echoed, not checked
            stream, include_usage, continuous = stream_flags(body)
            if chat:
                check_unsupported(body, UNSUPPORTED_CHAT)
                if stream and body.get("return_meta_info"):  # serving_chat.py:1321-1325
                    raise RequestError("return_meta_info is not supported with streaming. Please set stream=false "
                                       "when using return_meta_info=true.")
                input_ids, echo = self._chat_prompt(body, engine), ""
                params = sampling_from(body, "max_completion_tokens", None)
            else:
                check_unsupported(body, UNSUPPORTED_COMPLETION)
                input_ids, prompt_text = completion_prompt(body.get("prompt"), engine)
                echo = prompt_text if body.get("echo") else ""
                params = sampling_from(body, "max_tokens", 16)  # CompletionRequest.max_tokens = 16 (protocol.py:378)
            fill_max_new_tokens(params, input_ids, engine)
            engine.check(input_ids, params)
        except (RequestError, ChatTemplateError) as exc:
            return error_response(400, str(exc))
        except RecursionError:  # a value nested too deep to check or to quote in a message
            return error_response(400, "the body's JSON is nested too deep")
        except (ValueError, OverflowError) as exc:  # a value the checks above could not convert
            return error_response(400, f"bad request: {exc}")
        ctx = {"model": model, "created": int(time.time()), "chat": chat, "echo": echo,
               "spec": bool(body.get("return_spec_tokens_details")), "meta": bool(body.get("return_meta_info")),
               "include_usage": include_usage, "continuous": continuous, "params": params}
        if stream:
            return StreamingResponse(self._stream(engine, input_ids, params, ctx), media_type="text/event-stream")
        cancel = threading.Event()
        watcher = asyncio.create_task(cancel_on_disconnect(request, cancel))
        try:
            out = await run_in_threadpool(engine.generate, input_ids, params, None, cancel)
        except RequestError as exc:
            return error_response(400, str(exc))
        except Cancelled as exc:
            logger.info("generation cancelled: %s", exc)
            return error_response(503, str(exc), "ServiceUnavailable")
        except Exception as exc:
            logger.exception("generation failed")
            return error_response(500, f"Internal server error: {type(exc).__name__}: {exc}", "InternalServerError")
        finally:
            watcher.cancel()
        return JSONResponse(self._response(engine, out, ctx))

    def _chat_prompt(self, body: dict, engine: Engine) -> list[int]:
        template = load_chat_template(self.state.args.model_path)
        if template is None:
            raise RequestError("the model has no chat template (the tokenizer carries none): use /v1/completions")
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise RequestError(f"chat_template_kwargs must be an object, got {kwargs!r}")
        return engine.encode(render_chat(template, chat_messages(body.get("messages")), **kwargs))

    @staticmethod
    def _response(engine: Engine, out: Output, ctx: dict) -> dict:
        """CompletionResponse (protocol.py:528) / ChatCompletionResponse (protocol.py:1336), as serialised."""
        meta = out.meta_info
        finish, matched = _finish(meta)
        text = engine.output_text(out, ctx["params"])
        if ctx["chat"]:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None},
                      "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            if ctx["meta"]:
                choice["meta_info"] = meta
        else:
            choice = {"index": 0, "text": ctx["echo"] + text, "logprobs": None, "finish_reason": finish,
                      "matched_stop": matched}
        response = {"id": meta["id"], "object": "chat.completion" if ctx["chat"] else "text_completion",
                    "created": ctx["created"], "model": ctx["model"], "choices": [choice], "usage": usage(meta),
                    "metadata": {"weight_version": meta.get("weight_version", "default")}}
        details = spec_tokens_details(meta) if ctx["spec"] else None
        if details is not None:
            response["sglext"] = {"spec_tokens_details": details}
        return response

    async def _stream(self, engine: Engine, input_ids: list[int], params: SamplingParams, ctx: dict):
        """serving_completions.py:225-504 / serving_chat.py:2441-2805: a chunk per decode step, then (chat) a
        finish chunk, the sglext chunk when asked, the usage chunk when asked, and `data: [DONE]`."""
        chat, rid, deltas = ctx["chat"], uuid.uuid4().hex, TextDeltas(engine, params)
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": ctx["created"], "model": ctx["model"]}
        prompt_len, first, meta = len(input_ids), True, None
        events = engine_events(engine, input_ids, params)
        try:
            async for kind, payload in events:
                if kind == "error":
                    yield _sse({"error": {"object": "error", "message": payload, "type": "BadRequestError",
                                          "param": None, "code": 400}})
                    break
                ids = payload.output_ids if kind == "done" else payload
                meta = payload.meta_info if kind == "done" else None
                finish, matched = _finish(meta) if meta else (None, None)
                delta = deltas(ids, final=payload if kind == "done" else None)
                step_usage = usage(meta or {"prompt_tokens": prompt_len, "completion_tokens": len(ids)})
                if not chat:
                    text = (ctx["echo"] if first else "") + delta
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                              "matched_stop": matched}
                    yield _sse({**head, "choices": [choice], "usage": step_usage if ctx["continuous"] else None})
                else:
                    extra = {"usage": step_usage} if ctx["continuous"] else {}
                    if first:  # serving_chat.py:2583-2598 (sse_utils.build_sse_content: msgspec, defaults omitted)
                        yield _sse({**head, "choices": [_chat_choice({"role": "assistant", "content": ""})]})
                    if delta:
                        yield _sse({**head, "choices": [_chat_choice({"content": delta})], **extra})
                    if meta is not None:
                        yield _sse({**head, "choices": [_chat_choice({}, finish, matched)]})
                first = False
        finally:  # the client went away (Starlette closes this generator): stop the generation
            await events.aclose()
        if meta is not None:
            details = spec_tokens_details(meta) if ctx["spec"] else None
            if details is not None:
                yield _sse({**head, "choices": [], "usage": None, "sglext": {"spec_tokens_details": details}})
            if ctx["include_usage"]:
                final = usage(meta)
                if not chat:  # serving_completions.py:495 dumps this one with exclude_none
                    final = {k: v for k, v in final.items() if v is not None}
                yield _sse({**head, "choices": [], "usage": final})
        yield "data: [DONE]\n\n"


def _chat_choice(delta: dict, finish: str | None = None, matched: Any = None) -> dict:
    return {"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None, "finish_reason": finish,
            "matched_stop": matched}


def add_openai_routes(app: FastAPI, state: Any, model_name: str) -> None:
    routes = OpenAIRoutes(state, model_name)
    app.add_api_route("/v1/models", routes.models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", routes.model, methods=["GET"])
    app.add_api_route("/model_info", routes.model_info, methods=["GET"])
    app.add_api_route("/get_model_info", routes.model_info, methods=["GET"])
    app.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
