"""HTTP conformance: the engine as a real subprocess on a free port."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tools.testing import stop_process as stop
from workers.engine_process import free_port

pytestmark = pytest.mark.timeout(240)

NUM_STEPS = 3
FLAGS = ["--model-path", "tiny", "--load-format", "dummy", "--page-size", "16", "--attention-backend", "torch",
         "--context-length", "4096", "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
         "tiny", "--speculative-num-steps", str(NUM_STEPS), "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", str(NUM_STEPS + 1), "--random-seed", "0", "--host", "127.0.0.1",
         "--mem-fraction-static", "0.8", "--enable-metrics", "--decode-log-interval", "2"]
TIMEOUT = 60


def start(extra: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workers.reference", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=os.getcwd())


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = start([*FLAGS, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    statuses = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"server exited early: {proc.stdout.read()[-2000:]}"
            try:
                statuses.append(requests.get(f"{url}/health", timeout=10).status_code)
                if statuses[-1] == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # not listening yet / a loaded machine
                pass
            time.sleep(0.2)
        else:
            pytest.fail("server not healthy within 120 s")
        yield url, proc, statuses
    finally:
        stop(proc)


def post(url, body, **kw):
    return requests.post(f"{url}/generate", json=body, timeout=TIMEOUT, **kw)


def greedy(n=12, **kw):
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


def test_health_is_503_then_200(server):
    _, _, statuses = server
    assert statuses[-1] == 200 and set(statuses) <= {200, 503}


def test_generate_fields(server):
    url, _, _ = server
    r = post(url, {"text": "The cat sat on the mat.", "sampling_params": greedy(12)})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 12 and isinstance(body["text"], str)
    for key in ("id", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency", "ttft",
                "finish_reason", "spec_verify_ct", "spec_accept_length", "spec_accept_rate",
                "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram",
                "spec_steps"):
        assert key in meta, key
    assert meta["prompt_tokens"] == len("The cat sat on the mat.") and meta["completion_tokens"] == 12
    assert meta["cached_tokens"] == 0 and 0 < meta["ttft"] <= meta["e2e_latency"]
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["spec_accept_length"] == pytest.approx(12 / meta["spec_verify_ct"])
    assert meta["spec_accept_rate"] == 1.0  # the oracle
    for step in meta["spec_steps"]:
        assert set(step) == {"accept_len", "tree_depth", "tree_nodes", "verify_s", "batch_size"}
        assert step["batch_size"] == 1
        assert step["accept_len"] == NUM_STEPS + 1 and step["verify_s"] > 0


def test_generate_input_ids_matches_text(server):
    url, _, _ = server
    a = post(url, {"text": "abc", "sampling_params": greedy(8)}).json()
    b = post(url, {"input_ids": [97, 98, 99], "sampling_params": greedy(8)}).json()
    assert a["output_ids"] == b["output_ids"]


def test_stop_string(server):
    url, _, _ = server
    free = post(url, {"text": "hello", "sampling_params": greedy(16)}).json()
    stop = free["text"][3:5]
    r = post(url, {"text": "hello", "sampling_params": greedy(16, stop=stop)}).json()
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_stream_sse(server):
    url, _, _ = server
    r = post(url, {"text": "stream me", "stream": True, "sampling_params": greedy(10)}, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert len(chunks) >= 2
    final = chunks[-1]
    assert len(final["output_ids"]) == 10 and final["meta_info"]["finish_reason"]["type"] == "length"
    assert "spec_verify_ct" in final["meta_info"]
    plain = post(url, {"text": "stream me", "sampling_params": greedy(10)}).json()
    assert final["output_ids"] == plain["output_ids"] and final["text"] == plain["text"]


def test_logprobs_in_sglangs_answer_shape(server):
    """return_logprob + top_logprobs_num: meta_info as SGLang's tokenizer_manager builds it (output entries only,
    [logprob, token_id, null], top-n best first, the emitted token the best at temperature 0); the same in the
    last chunk of a stream; without return_logprob, no logprob field."""
    url, _, _ = server
    body = {"text": "The cat sat on the mat.", "return_logprob": True, "top_logprobs_num": 3,
            "sampling_params": greedy(9)}
    meta = post(url, body).json()["meta_info"]
    out = post(url, {**body, "stream": True}, stream=True)
    chunks = [json.loads(e[len("data: "):]) for e in out.iter_lines(decode_unicode=True) if e and e != "data: [DONE]"]
    ids = chunks[-1]["output_ids"]
    assert chunks[-1]["meta_info"]["output_top_logprobs"] == meta["output_top_logprobs"]
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []
    assert meta["output_token_logprobs_length"] == len(ids) == len(meta["output_top_logprobs"]) == 9
    for tok, (lp, tid, text), top in zip(ids, meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert tid == tok and text is None and len(top) == 3 and top[0] == [lp, tok, None]
        assert top[0][0] >= top[1][0] >= top[2][0] and all(e[0] <= 0 for e in top)
    plain = post(url, {"text": "The cat sat on the mat.", "sampling_params": greedy(9)}).json()
    assert plain["output_ids"] == ids and not any("logprob" in k for k in plain["meta_info"])
    only = post(url, {**body, "top_logprobs_num": 0}).json()["meta_info"]  # each token's own logprob only
    assert only["output_token_logprobs"] == meta["output_token_logprobs"] and "output_top_logprobs" not in only


@pytest.mark.parametrize("extra, fragment", [
    ({"return_logprob": "yes"}, "return_logprob must be true or false"),
    ({"logprob_start_len": 0}, "output-token logprobs only; allowed: -1"),
    ({"logprob_start_len": 50}, "logprob_start_len=50 is higher than the number of input tokens"),
    ({"top_logprobs_num": -1}, "top_logprobs_num must be an integer in [0, 259]"),
    ({"top_logprobs_num": 2.0}, "top_logprobs_num must be an integer"),
    ({"token_ids_logprob": [5]}, "token_ids_logprob=[5] is not supported"),
    ({"return_text_in_logprobs": True}, "return_text_in_logprobs=True is not supported"),
])
def test_logprob_fields_it_does_not_support_are_refused_by_name(server, extra, fragment):
    url, _, _ = server
    r = post(url, {"input_ids": [1, 2, 3], "return_logprob": True, **extra, "sampling_params": greedy(2)})
    assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
    # without return_logprob SGLang ignores the other logprob fields (scheduler.py:3256-3258)
    if "return_logprob" not in extra:
        ok = post(url, {"input_ids": [1, 2, 3], **extra, "sampling_params": greedy(2)})
        assert ok.status_code == 200 and "output_token_logprobs" not in ok.json()["meta_info"]


@pytest.mark.parametrize("data, fragment", [
    ("{not json", "malformed JSON"),
    (json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5000}}), "context length 4096"),
    (json.dumps({"text": "a", "input_ids": [1]}), "exactly one of text or input_ids"),
    (json.dumps({"sampling_params": {}}), "exactly one of text or input_ids"),
    (json.dumps({"input_ids": [[1, 2], [3]]}), "batch"),
    (json.dumps({"input_ids": [1, 99999]}), "out of range"),
    (json.dumps({"text": "a", "sampling_params": {"max_new_tokens": "many"}}), "sampling_params.max_new_tokens"),
    (json.dumps([1, 2]), "JSON object"),
])
def test_bad_requests_get_400_and_server_stays_healthy(server, data, fragment):
    url, proc, _ = server
    r = requests.post(f"{url}/generate", data=data, timeout=TIMEOUT, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert fragment in r.json()["error"]["message"]
    assert requests.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    assert proc.poll() is None


# Each answered 500 and closed the connection, or was silently coerced; SGLang answers 400 for each
# (SamplingParams.verify: temperature finite >= 0, top_p in (0, 1], sampling_seed in [-2**63, 2**63 - 1]).
BAD_FIELDS = [
    ('{"text": "\\ud800", "sampling_params": {"max_new_tokens": 2}}', "text is not valid Unicode"),
    ('{"text": "a", "sampling_params": {"max_new_tokens": 1e400}}', "sampling_params.max_new_tokens"),
    ('{"text": "a", "sampling_params": {"temperature": NaN}}', "sampling_params.temperature"),
    ('{"text": "a", "sampling_params": {"sampling_seed": %d}}' % 2**70, "sampling_params.sampling_seed"),
    ('{"text": "a", "sampling_params": {"max_new_tokens": "3"}}', "sampling_params.max_new_tokens"),
    ('{"text": "a", "sampling_params": {"max_new_tokens": 2.9}}', "sampling_params.max_new_tokens"),
    ('{"text": "a", "sampling_params": {"temperature": -5}}', "sampling_params.temperature"),
    ('{"text": "a", "sampling_params": {"top_p": 5}}', "sampling_params.top_p"),
    ('{"text": "a", "sampling_params": {"ignore_eos": "false"}}', "sampling_params.ignore_eos"),
    ('{"text": "a", "sampling_params": {"top_k": 5}}', "sampling_params.top_k"),
    ('{"text": "a", "stream": "false"}', "stream must be true or false"),
]


def test_bad_fields_get_400_naming_the_field_on_a_kept_alive_connection(server):
    url, proc, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=TIMEOUT)
    try:
        conn.connect()
        sock = conn.sock
        for body, fragment in BAD_FIELDS:
            conn.request("POST", "/generate", body=body.encode(), headers={"content-type": "application/json"})
            r = conn.getresponse()
            answer = json.loads(r.read())
            assert r.status == 400 and fragment in answer["error"]["message"], (body, answer)
            assert not r.will_close and conn.sock is sock, f"connection dropped after {body}"
        conn.request("POST", "/generate", body=json.dumps({"text": "ok", "sampling_params": greedy(2)}).encode(),
                     headers={"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and len(json.loads(r.read())["output_ids"]) == 2 and conn.sock is sock
    finally:
        conn.close()
    assert proc.poll() is None


def test_sglang_defaults_and_null_max_new_tokens_are_accepted(server):
    url, _, _ = server
    r = post(url, {"input_ids": [1, 2, 3], "sampling_params": {**greedy(4), "top_k": -1, "top_p": 0.5, "n": 1}})
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4, r.text
    r = requests.post(f"{url}/generate", json={"input_ids": [1] * 4090, "sampling_params": greedy(None)},
                      timeout=3 * TIMEOUT)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 6, r.text  # up to the context


def _flush_within(url: str, seconds: float) -> float:
    """Seconds until /flush_cache answers 200 (it answers 400 while a request runs); fails after `seconds`."""
    t0 = time.monotonic()
    while True:
        r = requests.post(f"{url}/flush_cache", timeout=TIMEOUT)
        if r.status_code == 200:
            return time.monotonic() - t0
        assert r.status_code == 400 and time.monotonic() - t0 < seconds, r.text
        time.sleep(0.05)


LONG = {"input_ids": [1] * 8, "sampling_params": greedy(4000)}  # tens of seconds of generation on CPU


def test_client_timeout_cancels_a_non_streamed_generation(server):
    url, _, _ = server
    with pytest.raises(requests.Timeout):
        requests.post(f"{url}/generate", json=LONG, timeout=1.0)
    _flush_within(url, 5.0)
    assert post(url, {"text": "next", "sampling_params": greedy(4)}).status_code == 200


def test_client_leaving_a_stream_cancels_the_generation(server):
    url, _, _ = server
    r = post(url, {**LONG, "stream": True}, stream=True)
    lines = r.iter_lines()
    assert next(x for x in lines if x).startswith(b"data: ")
    r.close()
    _flush_within(url, 5.0)
    assert post(url, {"text": "next", "sampling_params": greedy(4)}).status_code == 200


def test_a_stream_that_stalls_is_a_probe_timeout(server):
    """The engine's KV pool held by another client's request (the new one waits for pages): headers come, then
    nothing within the probe's timeout."""
    from workers.errors import ProbeTimeout
    from workers.http_client import Prompt, ProbeClient

    url, _, _ = server
    busy = post(url, {**LONG, "stream": True}, stream=True)
    lines = busy.iter_lines()  # held: a dropped iterator would close the connection (and cancel the request)
    try:
        next(x for x in lines if x)
        client = ProbeClient(url, timeout_s=1.0)
        with pytest.raises(ProbeTimeout, match="stalled"):
            client.generate(Prompt(input_ids=(1, 2, 3) * 70), 4)  # 210 + 4 tokens do not fit next to LONG
        client.close()
    finally:
        busy.close()
    _flush_within(url, 5.0)


def test_flush_cache(server):
    url, _, _ = server
    for method in (requests.get, requests.post):
        r = method(f"{url}/flush_cache", timeout=TIMEOUT)
        assert r.status_code == 200 and "flushed" in r.text.lower()
    assert post(url, {"text": "after flush", "sampling_params": greedy(4)}).status_code == 200


def test_server_info(server):
    """avg_spec_accept_length as SGLang reports it: complete --decode-log-interval windows (2 decode iterations
    here) since the last /flush_cache, the key absent before the first one."""
    url, _, _ = server

    def state():
        return requests.get(f"{url}/server_info", timeout=TIMEOUT).json()["internal_states"][0]

    assert requests.post(f"{url}/flush_cache", timeout=TIMEOUT).status_code == 200
    post(url, {"text": "info", "sampling_params": greedy(NUM_STEPS + 2)})  # prefill + 1 verify step (the oracle)
    assert "avg_spec_accept_length" not in state()
    post(url, {"text": "info", "sampling_params": greedy(NUM_STEPS + 2)})  # a second iteration closes the window
    assert state()["avg_spec_accept_length"] == pytest.approx(NUM_STEPS + 1)
    gauge = next(x for x in requests.get(f"{url}/metrics", timeout=TIMEOUT).text.splitlines()
                 if x.startswith("sglang:spec_accept_length{"))
    assert float(gauge.rsplit(" ", 1)[1]) == pytest.approx(NUM_STEPS + 1)
    assert requests.post(f"{url}/flush_cache", timeout=TIMEOUT).status_code == 200
    assert "avg_spec_accept_length" not in state()  # the flush resets it, as SGLang's
    info = requests.get(f"{url}/server_info", timeout=TIMEOUT).json()
    assert info["model_path"] == "tiny" and info["page_size"] == 16 and info["decode_log_interval"] == 2
    assert info["speculative_algorithm"] == "STANDALONE" and info["speculative_num_draft_tokens"] == NUM_STEPS + 1
    assert info["version"] and info["max_batch_size"] == 48


def test_metrics(server):
    url, _, _ = server
    before = requests.get(f"{url}/metrics", timeout=TIMEOUT).text
    post(url, {"input_ids": [5, 6, 7], "sampling_params": greedy(8)})
    text = requests.get(f"{url}/metrics", timeout=TIMEOUT).text

    def value(metrics, name):
        line = next(x for x in metrics.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    assert value(text, "sglang:prompt_tokens_total") - value(before, "sglang:prompt_tokens_total") == 3
    assert value(text, "sglang:generation_tokens_total") - value(before, "sglang:generation_tokens_total") == 8
    assert value(text, "sglang:num_requests_total") - value(before, "sglang:num_requests_total") == 1
    assert value(text, "sglang:spec_verify_calls_total") > value(before, "sglang:spec_verify_calls_total")
    assert "# TYPE sglang:prompt_tokens_total counter" in text


def test_server_info_limits_mean_what_sglangs_do(server):
    """max_req_input_len: prompts this long are refused whatever max_new_tokens, one token less is served (SGLang's
    /server_info field, sglang/srt/managers/scheduler.py:1946); max_total_num_tokens: the KV pool's tokens."""
    url, _, _ = server
    info = requests.get(f"{url}/server_info", timeout=TIMEOUT).json()
    edge, pool = info["max_req_input_len"], info["max_total_num_tokens"]
    assert edge == 4096 and pool >= edge + NUM_STEPS + 1  # --context-length 4096; the pool holds a draft tree more
    assert post(url, {"input_ids": [7] * (edge - 1), "sampling_params": greedy(1)}).status_code == 200
    r = post(url, {"input_ids": [7] * edge, "sampling_params": greedy(1)})
    assert r.status_code == 400 and "context length 4096" in r.text


@pytest.mark.parametrize("argv, fragment", [
    (["--model-path", "tiny", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--model-path", "tiny", "--page-size", "0"], "--page-size"),
    (["--model-path", "tiny", "--speculative-algorithm", "EAGLE"], "--speculative-algorithm"),
    (["--model-path", "tiny", "--speculative-algorithm", "STANDALONE"], "needs --speculative-draft-model-path"),
    (["--model-path", "/no/such/dir"], "--model-path"),
    (["--model-path", "tiny", "--page"], "unrecognized arguments: --page"),  # no abbreviations
    (["--model-path", "tiny", "--attention-backend", "flashinfer"], "invalid choice: 'flashinfer'"),
])
def test_bad_flags_exit_2_with_one_line(argv, fragment):
    proc = subprocess.run([sys.executable, "-m", "workers.reference", *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and fragment in lines[0], proc.stderr


def test_sigterm_ends_the_server():
    port = free_port()
    proc = start([*FLAGS, "--port", str(port)])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        # the fast exit after the graceful shutdown still flushes the server's last log lines
        assert "Finished server process" in proc.stdout.read()
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        stop(proc)
