"""Request checks shared by the native (/generate) and OpenAI-compatible routes of the reference engine's server.

SGLang's sampling-parameter rules (`SamplingParams.verify`, sglang/srt/sampling/sampling_params.py) with no
coercion, the fill-in of a missing `max_new_tokens`, and the watcher that cancels a generation whose client went away.
"""
from __future__ import annotations

import json
import math
import threading

from starlette.requests import Request

from .engine import Engine, RequestError, SamplingParams

SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "ignore_eos", "stop", "sampling_seed", "no_stop_trim")
# SGLang sampling params this engine does not implement: accepted only at SGLang's defaults
SGLANG_DEFAULTS = {"top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                   "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1}
# SGLang 0.5.23's /generate body (`GenerateRequest`, sglang/api/v1/api_types.py:236-277, checked by its contract
# gate, sglang/srt/entrypoints/http_server.py:933-940): a key it does not know is ignored ("unknown keys ignored"),
# while an unknown key in sampling_params is refused (`SamplingParams`, api_types.py:177-178, "unknown keys
# rejected"). This engine does the same. Of SGLang's own fields it serves the first group (the logprob fields with
# `parse_logprob`'s limits: output-token logprobs only); the second changes nothing a request returns here (routing,
# caching and disaggregation hints) and is ignored; the third would change what comes back, so it is taken only at
# SGLang's default (null, or the default given), never silently dropped.
GENERATE_SERVED = ("text", "input_ids", "stream", "sampling_params", "return_logprob", "logprob_start_len",
                   "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs")
GENERATE_NO_EFFECT = ("rid", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
                      "decode_tp_size", "routed_dp_rank", "disagg_prefill_dp_rank", "mm_hashes", "extra_key",
                      "priority", "cache_salt", "kv_hints", "routing_key", "session_id", "custom_labels",
                      "images_config")
GENERATE_AT_DEFAULT: dict[str, object] = {
    **dict.fromkeys(("return_hidden_states", "image_data", "video_data", "audio_data",
                     "require_reasoning", "lora_path", "session_params", "max_thinking_tokens",
                     "custom_logit_processor", "return_sampling_mask", "modalities")),
    "return_prompt_token_ids": False, "routed_experts_start_len": 0,
}
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1  # SGLang's sampling_seed range
# SGLang treats 0 <= temperature < _SAMPLING_EPS as greedy (sglang/srt/sampling/sampling_params.py:42, 245-248):
# 4.4e-38 or 5e-324 would overflow logits / temperature in float32
SAMPLING_EPS = 1e-6
FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A finite int or float (an int of any size: math.isfinite would overflow converting it to a float)."""
    return is_int(v) or (isinstance(v, float) and math.isfinite(v))


def parse_json_body(raw: bytes) -> dict:
    """The request body as a JSON object, or RequestError (HTTP 400) naming what is wrong: not UTF-8 (nor the
    UTF-16/32 that json.loads detects), malformed, an integer literal longer than Python converts
    (sys.get_int_max_str_digits), nesting deeper than the parser's recursion allows, or not an object."""
    try:
        body = json.loads(raw)
    except UnicodeDecodeError as exc:  # a ValueError too: before it
        raise RequestError(f"the body is not UTF-8 JSON: {exc.reason} at byte {exc.start}") from exc
    except RecursionError as exc:
        raise RequestError("the body's JSON is nested too deep for the parser") from exc
    except ValueError as exc:  # json.JSONDecodeError, or an integer beyond sys.get_int_max_str_digits()
        raise RequestError(f"malformed JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


def check_generate_fields(body: dict) -> None:
    """A /generate body's top-level keys, as SGLang's contract takes them: a field of GENERATE_AT_DEFAULT is a 400
    unless at its default (false, or an empty list, counts as unset); unknown keys are ignored, as there."""
    for key, value in body.items():
        if key not in GENERATE_AT_DEFAULT or value is None or value is False or (isinstance(value, list) and not value):
            continue
        default = GENERATE_AT_DEFAULT[key]
        if default is not None and type(value) is type(default) and value == default:
            continue
        raise RequestError(f"{key}={value!r} is not supported by the reference engine; allowed: null or SGLang's "
                           f"default ({default!r}); it serves {', '.join(GENERATE_SERVED)}")


def parse_sampling(raw, names: dict[str, str] | None = None) -> SamplingParams:
    """SGLang's checks (SamplingParams.verify), with no coercion: "3" or 2.9 is not an integer, "false" not a bool.
    `max_new_tokens` None means up to the context length (filled in by `fill_max_new_tokens`). `names` maps a
    native key to the name an error message gives it (the OpenAI routes: `max_new_tokens` -> `max_tokens`);
    unmapped keys are named `sampling_params.<key>`."""
    names = names or {}

    def name(key: str) -> str:
        return names.get(key, f"sampling_params.{key}")

    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RequestError("sampling_params must be an object (a batch in one body is not supported: send "
                           "concurrent requests)")
    for key, value in raw.items():
        if key in SAMPLING_KEYS or (key in SGLANG_DEFAULTS and (value is None or (
                not isinstance(value, bool) and value == SGLANG_DEFAULTS[key]))):
            continue
        allowed = ", ".join(name(k) for k in SAMPLING_KEYS) + "; at SGLang's defaults only: " + \
            ", ".join(f"{name(k)}={v}" for k, v in SGLANG_DEFAULTS.items())
        raise RequestError(f"{name(key)}={value!r} is not supported by the reference engine; allowed: {allowed}")
    n = raw.get("max_new_tokens", 128)
    if n is not None and not (is_int(n) and n >= 1):
        raise RequestError(f"{name('max_new_tokens')} must be an integer >= 1, got {n!r}")
    temperature = raw.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not (is_number(temperature) and temperature >= 0):
        raise RequestError(f"{name('temperature')} must be a non-negative finite number, got {temperature!r}")
    if temperature > FLOAT32_MAX:  # SGLang holds temperatures in a float32 tensor: inf, then NaN probabilities
        raise RequestError(f"{name('temperature')}={temperature!r} is beyond float32's largest value "
                           f"{FLOAT32_MAX!r}, where the engine samples; allowed: 0 .. {FLOAT32_MAX!r}")
    if temperature < SAMPLING_EPS:  # as SGLang: greedy (top_k=1), never a division by a tiny value
        temperature = 0.0
    top_p = raw.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not (is_number(top_p) and 0 < top_p <= 1):
        raise RequestError(f"{name('top_p')} must be in (0, 1], got {top_p!r}")
    if top_p < 1 and temperature > 0:
        raise RequestError(f"{name('top_p')}={top_p!r}: the reference engine samples from the whole "
                           "distribution; allowed: top_p=1, or temperature=0 (greedy)")
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError(f"{name('ignore_eos')} must be true or false, got {ignore_eos!r}")
    stop = raw.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(f"{name('stop')} must be a string or a list of strings, got {raw.get('stop')!r}")
    no_stop_trim = raw.get("no_stop_trim", False)
    if not isinstance(no_stop_trim, bool):
        raise RequestError(f"{name('no_stop_trim')} must be true or false, got {no_stop_trim!r}")
    seed = raw.get("sampling_seed")
    if seed is not None and not (is_int(seed) and SEED_MIN <= seed <= SEED_MAX):
        raise RequestError(f"{name('sampling_seed')} must be an integer in [-2**63, 2**63 - 1], got {seed!r}")
    return SamplingParams(max_new_tokens=n, temperature=float(temperature), ignore_eos=ignore_eos, stop=stop,
                          sampling_seed=seed, no_stop_trim=no_stop_trim)


def parse_logprob(body: dict, prompt_len: int, vocab_size: int) -> int | None:
    """The /generate body's logprob fields (SGLang's GenerateReqInput, sglang/srt/managers/io_struct.py:229-247):
    None without `return_logprob` (the other fields are then ignored, as SGLang does: scheduler.py:3256-3258), else
    `top_logprobs_num` (0: each output token's own logprob only). This engine returns output-token logprobs only:
    `logprob_start_len` -1 (SGLang's default: output tokens only, scheduler.py:3260-3264) or the prompt's length;
    a start inside the prompt (input logprobs), `token_ids_logprob` and `return_text_in_logprobs` are refused by name."""
    ret = body.get("return_logprob")
    if ret is None or ret is False:
        return None
    if ret is not True:
        raise RequestError(f"return_logprob must be true or false, got {ret!r}")
    start = body.get("logprob_start_len")
    start = -1 if start is None else start
    if not is_int(start):
        raise RequestError(f"logprob_start_len must be an integer, got {start!r}")
    if start > prompt_len:  # SGLang aborts the request with this (scheduler.py:3275-3280)
        raise RequestError(f"logprob_start_len={start} is higher than the number of input tokens {prompt_len}; "
                           "use a smaller logprob_start_len")
    if start not in (-1, prompt_len):
        raise RequestError(f"logprob_start_len={start}: the reference engine returns output-token logprobs only; "
                           f"allowed: -1 (SGLang's default) or the prompt's length {prompt_len}")
    top = body.get("top_logprobs_num")
    top = 0 if top is None else top
    if not (is_int(top) and 0 <= top <= vocab_size):
        raise RequestError(f"top_logprobs_num must be an integer in [0, {vocab_size}] (the vocabulary), got {top!r}")
    if body.get("token_ids_logprob"):
        raise RequestError(f"token_ids_logprob={body['token_ids_logprob']!r} is not supported by the reference "
                           "engine; allowed: null or [] (use top_logprobs_num)")
    if body.get("return_text_in_logprobs", False) is not False:
        raise RequestError(f"return_text_in_logprobs={body['return_text_in_logprobs']!r} is not supported by the "
                           "reference engine (entries carry no text: [logprob, token_id, null]); allowed: false")
    return top


def fill_max_new_tokens(params: SamplingParams, input_ids: list[int], engine: Engine) -> None:
    if params.max_new_tokens is None:  # SGLang: generate up to the context length
        params.max_new_tokens = max(1, engine.context_length - len(input_ids))


async def cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Sets `cancel` when the client closes the connection (the body is read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return
