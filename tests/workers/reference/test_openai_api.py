"""The reference engine's OpenAI-compatible routes (workers/reference/openai_api.py) against SGLang 0.5.23's own code.

In process (FastAPI's TestClient on `tiny`, dummy weights, the oracle drafter so that the speculative fields are
there): the routes' answers and semantics. Conformance: every body and stream chunk is re-serialised by SGLang's own
pydantic classes (sglang/srt/entrypoints/openai/protocol.py) and its msgspec chunk builder (sse_utils.py), in a child
process (importing SGLang patches transformers), and must come back unchanged. End to end: SGLang's bench_serving in
its three SGLang modes against a real engine process, every request completed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from fastapi.testclient import TestClient

from workers.engine_process import free_port
from workers.reference.args import parse_args
from workers.reference.chat_template import BYTE_CHAT_TEMPLATE, ChatTemplate, load_chat_template, render_chat
from workers.reference.engine import Output, SamplingParams
from workers.reference.openai_api import TextDeltas, chat_messages
from workers.reference.server import ServerState, create_app
from workers.reference.tokenizer import ByteTokenizer, load_tokenizer
from workers.reference.tokenizer_export import hf_tokenizer_dir

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[3]
FLAGS = ["--model-path", "tiny", "--load-format", "dummy", "--context-length", "2048", "--page-size", "16",
         "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "tiny",
         "--speculative-num-steps", "3", "--random-seed", "0"]
PROMPT = "The quick brown fox jumps over the lazy dog."
GREEDY = {"temperature": 0, "ignore_eos": True}
# SGLang's classes in a child process: (kind, our payload, extra) -> what SGLang's own serialiser makes of it
SGLANG_CHILD = r"""
import json, sys
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)
from sglang.srt.entrypoints.openai import protocol
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
from sglang.srt.entrypoints.openai.utils import spec_tokens_details_from_meta_info
out = []
for kind, ours, extra in json.load(sys.stdin):
    if kind == "pydantic":  # parse with SGLang's class, serialise as SGLang does
        obj = getattr(protocol, extra["cls"]).model_validate(ours)
        out.append(json.loads(obj.model_dump_json(exclude_none=extra.get("exclude_none", False))))
    elif kind == "sse":  # SGLang's msgspec chat chunk from the same fields
        choice = ours["choices"][0]
        text = build_sse_content(chunk_id=ours["id"], created=ours["created"], model=ours["model"],
                                 index=choice["index"], role=choice["delta"].get("role"),
                                 content=choice["delta"].get("content"), finish_reason=choice["finish_reason"],
                                 matched_stop=choice["matched_stop"], usage=ours.get("usage"))
        out.append(json.loads(text[len("data: "):]))
    elif kind == "spec":
        out.append(spec_tokens_details_from_meta_info(ours).model_dump())
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def client():
    """The app in process; /model_info writes the byte tokenizer's files into the user's cache (a few kB)."""
    state = ServerState(parse_args(FLAGS))
    state.load()
    assert state.ready.is_set(), state.load_error
    with TestClient(create_app(state)) as c:
        yield c


def events(response) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    assert response.headers["content-type"].startswith("text/event-stream")
    return [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]


def sglang_serialised(cases: list) -> list:
    proc = subprocess.run([sys.executable, "-c", SGLANG_CHILD], input=json.dumps(cases), capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_routes_answer_503_until_the_model_is_loaded():
    state = ServerState(parse_args(FLAGS))  # never loaded
    with TestClient(create_app(state)) as c:
        for path in ("/v1/models", "/model_info", "/get_model_info"):
            assert c.get(path).status_code == 503
        r = c.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["object"] == "error"


def test_models_and_model_info(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 2048
    assert client.get("/v1/models/tiny").json()["id"] == "tiny"
    missing = client.get("/v1/models/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    info = client.get("/model_info").json()
    assert info == client.get("/get_model_info").json()
    assert info["model_path"] == "tiny" and info["served_model_name"] == "tiny" and info["is_generation"] is True
    assert info["model_type"] == "qwen3" and info["weight_version"] == "default"


def test_model_info_tokenizer_path_encodes_as_the_engine(client):
    """bench_serving loads /model_info's tokenizer_path with transformers when no --tokenizer is given."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(client.get("/model_info").json()["tokenizer_path"])
    text = "Ünïcödé — “quotes” 日本語 🙂 <|im_start|>user\n\t 12345"
    assert tok.encode(text, add_special_tokens=False) == ByteTokenizer().encode(text)
    assert tok.decode(ByteTokenizer().encode(text)) == text
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 256, 257, 258)
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        render_chat(ChatTemplate(BYTE_CHAT_TEMPLATE), messages)


def test_completion_matches_generate_and_carries_its_speculative_fields(client):
    gen = client.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 12, **GREEDY}}).json()
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 12,
                                             "return_spec_tokens_details": True, **GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == gen["text"] and body["choices"][0]["finish_reason"] == "length"
    meta = gen["meta_info"]
    assert body["usage"] == {"prompt_tokens": len(PROMPT), "total_tokens": len(PROMPT) + 12, "completion_tokens": 12,
                             "prompt_tokens_details": None, "reasoning_tokens": 0,
                             "completion_tokens_details": None}
    details = body["sglext"]["spec_tokens_details"]
    for key in ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts",
                "spec_correct_drafts_histogram", "spec_accept_length", "spec_accept_rate"):
        assert details[key] == meta[key], key
    assert details["spec_num_correct_drafts"] > 0  # the oracle drafter: its drafts are accepted
    no_spec = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, **GREEDY}).json()
    assert "sglext" not in no_spec  # only when asked, as SGLang


def test_streamed_completion_is_the_same_text(client):
    full = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, **GREEDY}).json()
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "stream": True, "echo": True,
                                             "stream_options": {"include_usage": True},
                                             "return_spec_tokens_details": True, **GREEDY})
    data = events(r)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == PROMPT + full["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in text_chunks][-1] == "length"
    assert len({c["id"] for c in chunks}) == 1
    sglext, usage = chunks[-2], chunks[-1]
    assert sglext["choices"] == [] and sglext["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12


def test_chat_uses_the_template_and_returns_meta_info(client):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_completion_tokens": 10,
                                                  "return_meta_info": True, **GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    assert body["usage"]["prompt_tokens"] == len(prompt.encode())  # parts joined by a space, as SGLang
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["meta_info"]["completion_tokens"] == 10
    gen = client.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 10, **GREEDY}}).json()
    assert choice["message"]["content"] == gen["text"]
    streamed = events(client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 10,
                                                                "stream": True, **GREEDY}))
    deltas = [json.loads(d)["choices"][0]["delta"] for d in streamed[:-1]]
    assert deltas[0] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == gen["text"]


@pytest.mark.parametrize("route, body, fragment", [
    ("/v1/completions", {"prompt": PROMPT, "n": 2}, "n=2"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 1}, "logprobs=1"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, "max_tokens must be an integer >= 1"),
    ("/v1/completions", {"prompt": PROMPT, "seed": "1"}, "seed must be an integer"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "a batch of 2 prompts"),
    ("/v1/completions", {"prompt": ""}, "Prompt cannot be empty"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 5000}, "more than the context length 2048"),
    ("/v1/chat/completions", {"messages": []}, "messages must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True,
                              "return_meta_info": True}, "return_meta_info is not supported with streaming"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "x"}}]}]}, "only text parts"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools="),
])
def test_bad_requests_are_400_naming_the_field(client, route, body, fragment):
    r = client.post(route, json=body)
    assert r.status_code == 400 and fragment in r.json()["message"], r.text
    assert r.json()["object"] == "error" and r.json()["code"] == 400


def test_non_json_content_type_is_refused(client):
    r = client.post("/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and "Only 'application/json' is allowed" in r.json()["message"]


def test_text_deltas_hold_an_incomplete_utf8_character():
    deltas = TextDeltas(ByteTokenizer(), SamplingParams())  # only .decode is used
    e_acute = list("é".encode())
    assert deltas([65, e_acute[0]]) == "A"
    assert deltas([65, *e_acute]) == "é"
    assert deltas([65, *e_acute, 0xFF]) == ""
    assert deltas([65, *e_acute, 0xFF], final=Output([65, *e_acute, 0xFF], {"finish_reason": None})) == "\ufffd"


def test_chat_messages_flatten_text_parts():
    assert chat_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_text",
                                                                                    "text": "b"}]},
                          {"role": "assistant", "content": None}]) == \
        [{"role": "user", "content": "a b"}, {"role": "assistant", "content": ""}]


def test_smollm2_chat_template_is_the_gguf_one_and_renders_as_transformers():
    """The GGUF's `tokenizer.chat_template`, rendered as transformers renders it, and encoded to the same ids (the
    conversion cache and the exported tokenizer directory are the user's cache, as in test_gguf_checkpoint)."""
    transformers = pytest.importorskip("transformers")
    template = load_chat_template("smollm2-135m")
    assert template is not None and "<|im_start|>" in template.source
    tok = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir("smollm2-135m", 2048))
    messages = [{"role": "user", "content": "What is 2+2?"}]
    text = render_chat(template, messages)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert load_tokenizer("smollm2-135m").encode(text) == tok.encode(text, add_special_tokens=False)
    assert tok.eos_token == "<|im_end|>"


def test_bodies_and_chunks_are_what_sglangs_own_serialisers_make(client):
    """Each answer, parsed by SGLang's class and serialised as SGLang serialises it, comes back unchanged; the
    speculative details equal SGLang's `spec_tokens_details_from_meta_info` of the same meta_info."""
    spec = {"return_spec_tokens_details": True, "stream_options": {"include_usage": True}}
    completion = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **spec, **GREEDY}).json()
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                     "max_tokens": 8, "return_meta_info": True, **spec,
                                                     **GREEDY}).json()
    completion_stream = [json.loads(d) for d in events(client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "stream": True, **spec, **GREEDY}))[:-1]]
    chat_stream = [json.loads(d) for d in events(client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                      "stream": True, **spec, **GREEDY}))[:-1]]
    error = client.post("/v1/completions", json={"prompt": PROMPT, "n": 3}).json()
    cases = [("pydantic", completion, {"cls": "CompletionResponse"}),
             ("pydantic", chat, {"cls": "ChatCompletionResponse"}),
             ("pydantic", client.get("/v1/models").json(), {"cls": "ModelList"}),
             ("pydantic", error, {"cls": "ErrorResponse"}),
             ("spec", chat["choices"][0]["meta_info"], {})]
    for chunk in completion_stream[:-1]:
        cases.append(("pydantic", chunk, {"cls": "CompletionStreamResponse"}))
    cases.append(("pydantic", completion_stream[-1], {"cls": "CompletionStreamResponse", "exclude_none": True}))
    for chunk in chat_stream:
        cases.append(("sse", chunk, {}) if chunk["choices"] else
                     ("pydantic", chunk, {"cls": "ChatCompletionStreamResponse"}))
    expected = sglang_serialised(cases)
    for (kind, ours, extra), theirs in zip(cases, expected):
        if kind != "spec":
            assert ours == theirs, (kind, extra)
    assert expected[4] == chat["sglext"]["spec_tokens_details"]
    assert completion_stream[-2]["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0


BENCH = r"""
import sys
from workers.sglang.argcheck import prepare_sglang_imports
prepare_sglang_imports(None)  # torchvision stub: SGLang's multimodal configs import it; this CPU venv has no wheel for it
from sglang.benchmark.serving import cli_main
port, out_dir, backends = sys.argv[1], sys.argv[2], sys.argv[3:]
for backend in backends:
    sys.argv = ["bench_serving", "--backend", backend, "--host", "127.0.0.1", "--port", port,
                "--dataset-name", "random-ids", "--random-input-len", "32", "--random-output-len", "16",
                "--random-range-ratio", "1.0", "--num-prompts", "4", "--max-concurrency", "2", "--seed", "1",
                "--output-file", f"{out_dir}/{backend}.jsonl", "--output-details", "--disable-tqdm"]
    cli_main()
"""


def test_sglang_bench_serving_completes_every_request(tmp_path):
    """SGLang's bench_serving, unchanged (no --tokenizer, readiness check on), in its native, completions and chat
    modes against a real engine process: every request succeeds with the 16 tokens it asked for."""
    port = free_port()
    env = dict(os.environ, SPECSWEEP_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    server = subprocess.Popen([sys.executable, "-m", "workers.reference", *FLAGS, "--port", str(port)], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert server.poll() is None, server.stdout.read()[-2000:]
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        backends = ["sglang", "sglang-oai", "sglang-oai-chat"]
        bench = subprocess.run([sys.executable, "-c", BENCH, str(port), str(tmp_path), *backends], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=480)
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(30)
    for backend in backends:
        result = json.loads((tmp_path / f"{backend}.jsonl").read_text().splitlines()[-1])
        assert result["backend"] == backend
        assert result["completed"] == 4 and result["errors"] == [""] * 4, result["errors"]
        assert result["output_lens"] == [16] * 4 and result["total_output_tokens"] == 64


def _text_and_tokens(client, route: str, stream: bool, **sampling) -> tuple[str, int]:
    """The whole text of one greedy 16-token request (a stream's pieces joined) and its completion_tokens."""
    if route == "generate":
        body = {"text": PROMPT, "stream": stream,
                "sampling_params": {"temperature": 0, "max_new_tokens": 16, **sampling}}
    else:
        body = {"temperature": 0, "max_tokens": 16, "stream": stream, **sampling,
                **({"messages": [{"role": "user", "content": PROMPT}]} if route == "chat" else {"prompt": PROMPT})}
        if stream:
            body["stream_options"] = {"include_usage": True}
    path = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}[route]
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    if not stream:
        j = r.json()
        if route == "generate":
            assert j["meta_info"]["completion_tokens"] == len(j["output_ids"])
            return j["text"], j["meta_info"]["completion_tokens"]
        choice = j["choices"][0]
        return choice["message"]["content"] if route == "chat" else choice["text"], j["usage"]["completion_tokens"]
    chunks = [json.loads(e) for e in events(r) if e != "[DONE]"]
    if route == "generate":  # cumulative text: the last chunk is the finished request
        return chunks[-1]["text"], chunks[-1]["meta_info"]["completion_tokens"]
    pieces = [c["choices"][0]["delta"].get("content") or "" if route == "chat" else c["choices"][0]["text"]
              for c in chunks if c.get("choices")]
    return "".join(pieces), next(c["usage"]["completion_tokens"] for c in reversed(chunks) if c.get("usage"))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("route", ["generate", "completions", "chat"])
def test_a_matched_stop_string_is_cut_from_the_text_and_counted_in_the_tokens(client, route, stream):
    """As SGLang's detokenizer (`trim_matched_stop`, sglang/srt/managers/detokenizer_manager.py:194-212): the text
    ends before the stop string it matched (with no_stop_trim, after it); completion_tokens counts every generated
    token, the stop string's included, either way. An OpenAI stream joins its deltas: as SGLang's (:393-426), the
    start of the stop string a step sent before the step that completed it stays sent, the rest never comes."""
    free, _ = _text_and_tokens(client, route, False)
    start = next(i for i in range(3, len(free) - 1) if "\ufffd" not in free[i:i + 2])  # whole characters
    stop = free[start:start + 2]
    cut = free.find(stop)
    text, tokens = _text_and_tokens(client, route, stream, stop=[stop])
    if stream and route != "generate":
        assert text.startswith(free[:cut]) and len(text) < cut + len(stop) and stop not in text, (text, free, stop)
    else:
        assert text == free[:cut], (text, free, stop)
    kept, kept_tokens = _text_and_tokens(client, route, stream, stop=[stop], no_stop_trim=True)
    assert kept == free[:cut + len(stop)] and kept_tokens == tokens


def _sglang_api_types():
    """SGLang 0.5.23's generated /generate contract (sglang/api/v1/api_types.py), loaded from its file alone."""
    import importlib.util

    from tests.workers.sglang.source import package_dir

    root = package_dir("sglang")
    if root is None:
        pytest.skip("sglang is not installed (pip install --no-deps sglang==0.5.23)")
    spec = importlib.util.spec_from_file_location("sglang_api_types", root / "api" / "v1" / "api_types.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generate_takes_sglangs_contract_for_top_level_fields(client):
    """SGLang's /generate ignores a top-level key it does not know and refuses an unknown sampling_params key
    (its contract gate, sglang/srt/entrypoints/http_server.py:933-940); so does this engine. Of SGLang's own fields,
    those it does not serve are refused unless at SGLang's default."""
    from workers.reference.request_params import GENERATE_AT_DEFAULT, GENERATE_NO_EFFECT, GENERATE_SERVED

    api = _sglang_api_types()
    fields = {name: default.factory() if hasattr(default, "factory") else default  # a msgspec default factory
              for name, default in zip(api.GenerateRequest.__struct_fields__, api.GenerateRequest.__struct_defaults__)}
    assert set(fields) == set(GENERATE_SERVED) | set(GENERATE_NO_EFFECT) | set(GENERATE_AT_DEFAULT)
    assert {k: v for k, v in GENERATE_AT_DEFAULT.items() if v is not None} == {
        k: v for k, v in fields.items() if k in GENERATE_AT_DEFAULT and v is not None}

    def sglang_admits(body) -> bool:
        try:
            api.GenerateRequest.from_json_value(body)
        except api.JsonContractError:
            return False
        return True

    greedy = {"temperature": 0, "max_new_tokens": 4}
    for body in ({"text": PROMPT, "sampling_params": greedy, "bogus_field": 1},
                 {"text": PROMPT, "sampling_params": {**greedy, "bogus": 1}},
                 {"text": PROMPT, "sampling_params": greedy, "return_logprob": False, "logprob_start_len": -1,
                  "rid": "r1", "priority": 3}):
        r = client.post("/generate", json=body)
        assert (r.status_code == 200) == sglang_admits(body), (body, r.text)
    body = {"text": PROMPT, "sampling_params": greedy, "return_logprob": True, "top_logprobs_num": 2}
    assert sglang_admits(body)  # served: output-token logprobs in SGLang's shape (request_params.parse_logprob)
    r = client.post("/generate", json=body)
    assert r.status_code == 200 and len(r.json()["meta_info"]["output_top_logprobs"]) == 4, r.text
    body = {"text": PROMPT, "sampling_params": greedy, "return_hidden_states": True}
    assert sglang_admits(body)  # SGLang serves it; this engine has no hidden states and says so instead of dropping them
    r = client.post("/generate", json=body)
    assert r.status_code == 400 and "return_hidden_states=True is not supported" in r.json()["error"]["message"]
