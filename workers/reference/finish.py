"""How a reference-engine request finishes, as SGLang: its finish reason, and the text a finished request returns.

    finish_reason(out, params, decode, eos_id) -> dict | None   trims `out` at a stop string / EOS / the length limit
    trim_matched_stop(text, finish_reason, no_stop_trim) -> str the text without the stop string it matched
"""
from __future__ import annotations

from typing import Callable, Protocol


class FinishParams(Protocol):
    """What of a request's SamplingParams (engine.py) decides how it finishes."""

    max_new_tokens: int
    ignore_eos: bool
    stop: list[str]


def finish_reason(out: list[int], params: FinishParams, decode: Callable[[list[int]], str],
                  eos_id: int | None) -> dict | None:
    """Trims `out` in place at the first stop string / EOS / length limit; returns SGLang's finish_reason. As
    SGLang (`Req.update_finish_state`, sglang/srt/managers/schedule_batch.py:2007-2042): a stop string before an
    EOS, and a stop found past max_new_tokens (a verify step can overshoot it) is a length finish."""
    text = decode(out) if params.stop else ""
    for stop in (s for s in params.stop if s and s in text):
        for n in range(1, min(len(out), params.max_new_tokens) + 1):
            if stop in decode(out[:n]):
                del out[n:]
                return {"type": "stop", "matched": stop}
    if not params.ignore_eos and eos_id is not None and eos_id in out[:params.max_new_tokens]:
        del out[out.index(eos_id) + 1:]
        return {"type": "stop", "matched": eos_id}
    if len(out) >= params.max_new_tokens:
        del out[params.max_new_tokens:]
        return {"type": "length", "length": params.max_new_tokens}
    return None


def trim_matched_stop(text: str, finish_reason: dict | None, no_stop_trim: bool) -> str:
    """A finished request's text as SGLang returns it: cut before the stop string it matched, or after it with
    no_stop_trim (`DetokenizerManager.trim_matched_stop`, sglang/srt/managers/detokenizer_manager.py:194-212,
    no_stop_trim false by default). The output ids and completion_tokens keep the stop string's tokens, as there."""
    matched = (finish_reason or {}).get("matched")
    if not isinstance(matched, str) or (pos := text.find(matched)) == -1:
        return text
    return text[:pos + len(matched)] if no_stop_trim else text[:pos]
