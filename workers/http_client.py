"""The HTTP client every engine is probed and read through: SGLang's native routes, which the reference and stub
engines serve too. Below the engine folders (workers/<engine>/ import it; it imports none of them).

    Prompt(input_ids | text).body()            the /generate request's prompt field
    ProbeClient(base_url, timeout_s)
        .flush_cache()                         POST /flush_cache (retried while an abandoned request still runs)
        .generate(prompt, gen_tokens, temperature=0.0, stream=True, top_logprobs_num=None) -> Generation
        .server_info() -> dict                 GET /server_info
        .metrics_text() -> str                 GET /metrics (Prometheus text)

Every call has a timeout. A response without the fields we need raises BadResponse; a request past its timeout
raises ProbeTimeout (workers.errors), naming the config key the wait derives from (TIMEOUT_KEY).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator, cast

import requests
import urllib3

from workers.errors import BadResponse, ProbeTimeout

@dataclass(frozen=True)
class Prompt:
    input_ids: tuple[int, ...] | None = None
    text: str | None = None

    @property
    def num_tokens(self) -> int | None:
        return len(self.input_ids) if self.input_ids is not None else None

    def body(self) -> dict[str, Any]:
        return {"input_ids": list(self.input_ids)} if self.input_ids is not None else {"text": self.text}


CONNECT_TIMEOUT_S = 5.0
TIMEOUT_KEY = "engine.request_timeout_s"  # the config key every wait of this client derives from


# ---------------------------------------------------------------- HTTP client


@dataclass
class Generation:
    text: str
    output_ids: list[int]
    meta_info: dict[str, Any]
    client_ttft_s: float | None  # first streamed chunk carrying tokens, measured here
    client_e2e_s: float
    top_logprobs_num: int | None = None  # asked for with return_logprob: meta_info carries output_top_logprobs


class ProbeClient:
    def __init__(self, base_url: str, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.http = requests.Session()
        self.http.trust_env = False

    def close(self) -> None:
        self.http.close()

    def flush_cache(self) -> None:
        """400 means a request is still running (SGLang, the reference engine): one that an earlier run abandoned
        (a per-request timeout) stops at the engine's next step, which on a slow machine may be a long prefill; so
        ask again for up to the request timeout, and name it when the engine is still busy after that."""
        t0 = time.monotonic()
        while True:
            r = self._call("POST", "/flush_cache", timeout=self.timeout_s)
            if r.status_code == 200:
                return
            waited = time.monotonic() - t0
            if r.status_code == 400 and waited <= self.timeout_s:
                time.sleep(0.1)
                continue
            if r.status_code == 400:
                raise ProbeTimeout(f"the engine still runs an earlier request after {waited:.1f} s "
                                   f"({TIMEOUT_KEY}={self.timeout_s:g}): /flush_cache answered 400: {r.text[:200]}")
            raise BadResponse(f"/flush_cache answered {r.status_code}: {r.text[:200]}")

    def server_info(self) -> dict[str, Any]:
        r = self._call("GET", "/server_info", timeout=30.0)
        if r.status_code != 200:
            raise BadResponse(f"/server_info answered {r.status_code}")
        return r.json()

    def generate(self, prompt: Prompt, gen_tokens: int, temperature: float = 0.0,
                 stream: bool = True, top_logprobs_num: int | None = None) -> Generation:
        """`top_logprobs_num`: also ask for each output token's top-n logprobs (SGLang's GenerateReqInput fields
        return_logprob, top_logprobs_num, sglang/srt/managers/io_struct.py:229-235; the answer's
        meta_info.output_top_logprobs, tokenizer_manager.py:2960-2972)."""
        body = {**prompt.body(), "stream": stream,
                "sampling_params": {"max_new_tokens": gen_tokens, "temperature": temperature, "ignore_eos": True}}
        if top_logprobs_num is not None:
            body.update(return_logprob=True, top_logprobs_num=top_logprobs_num)
        t0 = time.perf_counter()
        deadline = t0 + self.timeout_s
        r = self._call("POST", "/generate", json=body, stream=stream, timeout=self.timeout_s)
        with r:
            if r.status_code != 200:
                raise BadResponse(f"/generate answered {r.status_code}: {r.text[:500]}")
            if "text/event-stream" not in r.headers.get("content-type", ""):
                out = _json(r)
                return _generation([out], None, time.perf_counter() - t0, top_logprobs_num)
            chunks, ttft = [], None
            try:
                # text/event-stream has a charset (else ISO-8859-1): requests decodes every line to str
                for line in cast(Iterator[str], r.iter_lines(decode_unicode=True)):
                    if time.perf_counter() > deadline:
                        raise ProbeTimeout(self._past("/generate ran", t0))
                    if not line or not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise BadResponse(f"/generate stream reported an error: {str(chunk['error'])[:300]}")
                    if ttft is None and (chunk.get("output_ids") or chunk.get("text")):
                        ttft = time.perf_counter() - t0
                    chunks.append(chunk)
            except requests.exceptions.Timeout as e:
                raise ProbeTimeout(self._past("/generate stream stalled", t0)) from e
            except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError) as e:
                if _is_read_timeout(e):  # requests reports a read timeout inside a body as a ConnectionError
                    raise ProbeTimeout(self._past("/generate stream stalled", t0)) from e
                raise BadResponse(f"/generate stream broke: {e}") from e
            except json.JSONDecodeError as e:
                raise BadResponse(f"/generate sent a chunk that is not JSON: {e}") from e
            if not chunks:
                raise BadResponse("/generate stream ended without a chunk")
            return _generation(chunks, ttft, time.perf_counter() - t0, top_logprobs_num)

    def metrics_text(self) -> str:
        """GET /metrics (Prometheus text; SGLang mounts it with --enable-metrics)."""
        r = self._call("GET", "/metrics", timeout=30.0)
        if r.status_code != 200:
            raise BadResponse(f"/metrics answered {r.status_code}")
        return r.text

    def _past(self, what: str, t0: float) -> str:
        """A per-request timeout's failure: the key, its value and the time measured."""
        return (f"{what} past {TIMEOUT_KEY}={self.timeout_s:g} (measured {time.perf_counter() - t0:.1f} s); "
                f"a slow machine needs a larger {TIMEOUT_KEY}")

    def _call(self, method: str, path: str, timeout: float, **kw) -> requests.Response:
        t0 = time.perf_counter()
        try:
            return self.http.request(method, self.base_url + path, timeout=(CONNECT_TIMEOUT_S, timeout), **kw)
        except requests.exceptions.Timeout as e:
            if timeout == self.timeout_s:
                raise ProbeTimeout(self._past(f"{method} {path}", t0)) from e
            raise ProbeTimeout(f"{method} {path} timed out after {timeout:.0f} s") from e
        except requests.exceptions.RequestException as e:
            raise BadResponse(f"{method} {path} failed: {e}") from e


def _is_read_timeout(e: Exception) -> bool:
    return any(isinstance(a, urllib3.exceptions.ReadTimeoutError) for a in e.args)


def _json(r: requests.Response) -> dict[str, Any]:
    try:
        out = r.json()
    except ValueError as e:
        raise BadResponse(f"/generate body is not JSON: {r.text[:200]}") from e
    if isinstance(out, list) and len(out) == 1:
        out = out[0]
    if not isinstance(out, dict):
        raise BadResponse(f"/generate body is not an object: {str(out)[:200]}")
    return out


def _generation(chunks: list[dict[str, Any]], ttft: float | None, e2e: float,
                top_logprobs_num: int | None = None) -> Generation:
    last = chunks[-1]
    meta = last.get("meta_info")
    if not isinstance(meta, dict):
        raise BadResponse(f"/generate response has no meta_info: {str(last)[:200]}")
    n = meta.get("completion_tokens")
    ids = list(last.get("output_ids") or [])
    text = last.get("text") or ""
    if len(chunks) > 1 and isinstance(n, int) and len(ids) < n:  # incremental chunks: concatenate
        ids = [i for c in chunks for i in (c.get("output_ids") or [])]
        text = "".join(c.get("text") or "" for c in chunks)
    return Generation(text=text, output_ids=ids, meta_info=meta, client_ttft_s=ttft, client_e2e_s=e2e,
                      top_logprobs_num=top_logprobs_num)
