"""Continuous batching: concurrent requests decode together and each gets exactly the tokens it gets alone."""
from __future__ import annotations

import threading
import time

import pytest

from tools.testing import spec_flags
from workers.reference.engine import Cancelled, SamplingParams

pytestmark = pytest.mark.timeout(300)

DRAFTERS = {
    "none": [],
    "ngram": spec_flags("NGRAM", steps=3, topk=2, tokens=6),
    "oracle": spec_flags("STANDALONE", draft="tiny", steps=3),
    "draft-tree": spec_flags("STANDALONE", draft="tiny-draft", steps=3, topk=2, tokens=6),
    "self-draft": spec_flags("STANDALONE", draft="tiny", layers=2, steps=3),
}


def prompts(engine) -> list[list[int]]:
    """Mixed lengths (9 .. ~330 tokens), predictable and novel text."""
    return [engine.encode("The cat sat on the mat. " * 13 + "The cat"),
            engine.encode("novel text: 7f3a9 qzx"),
            engine.encode("A quick brown fox jumps over the lazy dog. " * 3),
            engine.encode("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29")]


NEW_TOKENS = [40, 12, 29, 40]  # different lengths: requests leave the batch at different steps


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def run_concurrently(engine, jobs: list[tuple[list[int], SamplingParams]], stagger_s: float = 0.0) -> list:
    """Each job from its own thread (as the server's worker threads); results (or exceptions) in job order."""
    results: list = [None] * len(jobs)

    def work(i):
        try:
            results[i] = engine.generate(*jobs[i])
        except Exception as exc:  # recorded, asserted by the caller
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join(240)
    return results


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_concurrent_requests_get_their_sequential_tokens(make_engine, page_size, name):
    engine = make_engine("--page-size", str(page_size), *DRAFTERS[name])
    jobs = [(p, greedy(n)) for p, n in zip(prompts(engine), NEW_TOKENS)]
    alone = [engine.generate(*job) for job in jobs]
    together = run_concurrently(engine, jobs)
    for i, (a, b) in enumerate(zip(alone, together)):
        assert not isinstance(b, Exception), f"request {i}: {b!r}"
        assert b.output_ids == a.output_ids, f"request {i} differs when batched"
        assert b.meta_info["completion_tokens"] == NEW_TOKENS[i]
    if name != "none":
        batch = [max(s["batch_size"] for s in out.meta_info["spec_steps"]) for out in together]
        assert max(batch) > 1, "no step ran several requests"
        assert all(max(s["batch_size"] for s in out.meta_info["spec_steps"]) == 1 for out in alone)
    assert engine.stats.max_batch_size > 1
    alloc = engine.target.pool.allocator
    assert alloc.num_free == alloc.num_pages  # every request's pages went back
    assert engine.num_active() == 0


def test_oracle_commits_every_draft_in_a_batch(make_engine):
    engine = make_engine("--page-size", "16", *DRAFTERS["oracle"])
    jobs = [(p, greedy(n)) for p, n in zip(prompts(engine), NEW_TOKENS)]
    for out in run_concurrently(engine, jobs):
        steps = out.meta_info["spec_steps"]
        assert all(s["accept_len"] == 4 for s in steps[:-1])  # the last step may be cut at max_new_tokens


def test_max_running_requests_caps_the_batch(make_engine):
    engine = make_engine("--page-size", "16", "--max-running-requests", "2", *DRAFTERS["ngram"])
    jobs = [(p, greedy(n)) for p, n in zip(prompts(engine), NEW_TOKENS)]
    alone = [engine.generate(*job).output_ids for job in jobs]
    together = run_concurrently(engine, jobs)
    assert [out.output_ids for out in together] == alone
    assert max(s["batch_size"] for out in together for s in out.meta_info["spec_steps"]) == 2
    assert engine.stats.max_batch_size == 2


def test_a_request_waits_until_the_kv_pool_can_hold_it(make_engine):
    # pool of 512 tokens, page 16: each request reserves prompt + 40 new + headroom (~400 for the first):
    # the first and the short ones cannot all run at once, the rest wait for pages and then run
    engine = make_engine("--page-size", "16", "--max-total-tokens", "512", *DRAFTERS["none"])
    jobs = [(p, greedy(n)) for p, n in zip(prompts(engine), NEW_TOKENS)]
    alone = [engine.generate(*job).output_ids for job in jobs]
    together = run_concurrently(engine, jobs, stagger_s=0.05)
    assert [out.output_ids for out in together] == alone
    assert 1 < engine.stats.max_batch_size < 4  # the pool never held all four at once
    alloc = engine.target.pool.allocator
    assert alloc.num_free == alloc.num_pages


def test_a_cancelled_request_leaves_the_batch_and_the_others_finish(make_engine):
    engine = make_engine("--page-size", "16", *DRAFTERS["oracle"])
    ps = prompts(engine)
    alone = engine.generate(ps[0], greedy(40)).output_ids
    cancel = threading.Event()
    seen = threading.Event()
    errors: list = []

    def cancelled_one():
        try:
            engine.generate(ps[2], greedy(200), on_tokens=lambda ids: seen.set() if len(ids) > 8 else None,
                            cancel=cancel)
        except Cancelled as exc:
            errors.append(exc)

    t = threading.Thread(target=cancelled_one)
    t.start()
    seen.wait(60)
    result: list = []
    other = threading.Thread(target=lambda: result.append(engine.generate(ps[0], greedy(40))))
    other.start()
    time.sleep(0.3)
    cancel.set()
    t.join(60)
    other.join(120)
    assert errors and "went away" in str(errors[0])
    assert result[0].output_ids == alone
    alloc = engine.target.pool.allocator
    assert alloc.num_free == alloc.num_pages
    draft_alloc = engine.drafter.runner.pool.allocator
    assert draft_alloc.num_free == draft_alloc.num_pages


def test_flush_cache_refused_while_requests_run(make_engine):
    from workers.reference.engine import Cancelled, RequestError

    engine = make_engine("--page-size", "16")
    started, cancel = threading.Event(), threading.Event()
    out: list = []

    def work():
        try:  # far more tokens than the flush check needs: still running however slow this thread is scheduled
            out.append(engine.generate(prompts(engine)[0], greedy(1600), on_tokens=lambda ids: started.set(),
                                       cancel=cancel))
        except Exception as exc:  # noqa: BLE001 (the assertion below names it)
            out.append(exc)

    t = threading.Thread(target=work)
    t.start()
    assert started.wait(60)
    with pytest.raises(RequestError, match="while a request is running"):
        engine.flush_cache()
    cancel.set()
    t.join(60)
    assert isinstance(out[0], Cancelled), out
    deadline = time.monotonic() + 30  # the cancelled request leaves the batch at its next step
    while True:
        try:
            engine.flush_cache()
            break
        except RequestError:
            assert time.monotonic() < deadline, "flush still refused 30 s after the only request was cancelled"
            time.sleep(0.05)
    assert engine.num_active() == 0


def test_close_ends_the_scheduler_and_later_requests(make_engine):
    engine = make_engine("--page-size", "16")
    assert len(engine.generate([1, 2, 3], greedy(4)).output_ids) == 4
    thread = engine._thread
    engine.close()
    assert not thread.is_alive()
    with pytest.raises(Cancelled, match="shutting down"):
        engine.generate([1, 2, 3], greedy(4))


# ---------------------------------------------------------------- over HTTP: the real engine process, a real port


@pytest.fixture(scope="module")
def ngram_engine(tmp_path_factory):
    import dataclasses

    from workers.engine_process import EngineProcess
    from tools.testing import tiny_server

    server = tiny_server("ngram", num_steps=4)
    server = dataclasses.replace(server, engine=dataclasses.replace(server.engine,
                                                                    extra_args=("--max-total-tokens", "65536")))
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with EngineProcess.for_server(server, log) as engine:
        yield engine.base_url


def test_concurrent_http_requests_get_their_sequential_tokens(ngram_engine):
    import concurrent.futures

    import requests

    def generate(text: str, n: int) -> dict:
        body = {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
        r = requests.post(f"{ngram_engine}/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    texts = [f"Request {i}. " + "The cat sat on the mat. " * (1 + 5 * i) for i in range(4)]
    alone = [generate(t, n) for t, n in zip(texts, NEW_TOKENS)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(generate, texts, NEW_TOKENS))
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]
    assert max(s["batch_size"] for r in together for s in r["meta_info"]["spec_steps"]) > 1
    info = requests.get(f"{ngram_engine}/server_info", timeout=10).json()
    assert info["max_batch_size"] == 48 == info["internal_states"][0]["effective_max_running_requests_per_dp"]
    metrics = requests.get(f"{ngram_engine}/metrics", timeout=10).text
    assert "sglang:num_running_reqs" in metrics and "sglang:num_queue_reqs" in metrics


def test_more_non_streamed_requests_than_starlettes_default_threads_run_together(ngram_engine):
    """44 non-streamed requests at once (a KV pool for all of them): each waits in a server thread; all must reach
    the engine's batch (Starlette's default pool of 40 threads would hold 4 back)."""
    import concurrent.futures

    import requests

    def generate(i: int) -> dict:
        body = {"text": f"Request {i}. The cat sat on the mat.",
                "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}}
        r = requests.post(f"{ngram_engine}/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]

    with concurrent.futures.ThreadPoolExecutor(44) as pool:
        metas = list(pool.map(generate, range(44)))
    assert max(s["batch_size"] for m in metas for s in m["spec_steps"]) > 40
