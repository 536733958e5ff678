"""The context edge on SGLang: our rule (`specsweep_common.sglang_limits`) gives, at every edge,
what SGLang 0.5.23's own code does with the request, and `check_context` refuses exactly the points SGLang would
refuse, abort or cut short.

SGLang's code runs in a process of its own (tests/workers/sglang/cpu_process.py, `context`): for each server argv our
adapter builds, `prepare_server_args` + `publish`, then per request `TokenizerManager._validate_one_request`,
`TpModelWorker.get_worker_info`, `Scheduler.init_req_max_new_tokens` and `validate_input_length`.
"""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.plan import build_server
from orchestrator.config.context import check_context
from workers.sglang.rules import reserved_tokens
from specsweep_common.sglang_limits import max_req_input_len, sglang_generated
from workers.sglang.argv import build_sglang_argv

from tests.workers.sglang.cpu_process import run_in_sglang_process
from tests.workers.sglang.test_argv import _compose, _require, _sglang_installed, _write_model

CONTEXT = 8192
SERVERS = {  # name: overrides (qwen3-8b, 8192-token server context)
    "ngram": ["drafter=ngram", "attention=triton", "page_size=1"],  # no reserve: the scheduler's 2 slots bind
    "eagle3": ["drafter=eagle3", "drafter.draft_model_path=x", "attention=triton", "page_size=1"],  # reserve 4
    "eagle3-tree": ["drafter=eagle3", "drafter.draft_model_path=x", "attention=triton", "page_size=1",
                    "drafter.topk=4", "drafter.num_draft_tokens=8"],  # reserve max(4 * 3, 8) = 12
    "ngram-page16": ["drafter=ngram", "attention=triton", "page_size=16"],  # the KV pool rounds prompts up to pages
}


def _cases(reserve: int, page: int) -> list[dict]:
    """Each edge: exactly at the limit, one token below, one above."""
    margin, cases = max(reserve, 2), []
    for d in (-1, 0, 1):
        cases.append({"prompt": CONTEXT - 32 - margin + d, "gen": 32})  # prompt + gen + max(reserve, 2) <= context
        cases.append({"prompt": CONTEXT - 7 + d, "gen": 1})  # prompt <= context - 7 (or the reserve's bound)
        # a KV pool smaller than the context: gen <= pool - prompt rounded up to pages - one page - 1
        pool = 32 + -(-1000 // page) * page + page + 1
        cases.append({"prompt": 1000, "gen": 32, "max_total_tokens": pool + d})
        cases.append({"prompt": pool - 6 + d, "gen": 1, "max_total_tokens": pool})  # the pool's max_req_input_len
    return [{"id": f"{i}", **c} for i, c in enumerate(cases)]


@pytest.fixture(scope="module")
def sglang_verdicts(tmp_path_factory):
    _require(_sglang_installed(), "sglang is not installed (pip install --no-deps sglang==0.5.23, see docs/sglang.md)")
    tmp = tmp_path_factory.mktemp("models")
    configs, servers = {}, []
    for name, overrides in SERVERS.items():
        rc = _compose(["engine=sglang", "model=qwen3-8b", f"server_context_len={CONTEXT}", *overrides])
        target = _write_model(tmp / "target", rc.model)
        draft = _write_model(tmp / "draft", dataclasses.replace(rc.model, num_layers=1))
        local = dataclasses.replace(rc, model=dataclasses.replace(rc.model, path=target))
        if local.drafter.draft_model_path:
            local = dataclasses.replace(local, drafter=dataclasses.replace(local.drafter, draft_model_path=draft))
        cases = [{**c, "id": f"{name}/{c['id']}"} for c in _cases(reserved_tokens(rc), rc.page_size)]
        configs[name] = (rc, cases)
        servers.append({"argv": build_sglang_argv(build_server(local), 30000)[3:], "cases": cases})
    results = run_in_sglang_process("context", {"servers": servers})["results"]
    return configs, {r["id"]: r for r in results}


def test_our_rule_is_sglangs_at_every_edge(sglang_verdicts):
    configs, verdicts = sglang_verdicts
    for name, (rc, cases) in configs.items():
        reserve = reserved_tokens(rc)
        for case in cases:
            got = verdicts[case["id"]]
            assert got["reserve"] == reserve, name  # compute_num_reserved_tokens() on the published args
            assert got["max_req_input_len"] == max_req_input_len(CONTEXT, case.get("max_total_tokens")), case
            sglang = None if got["refused"] or got["aborted"] else got["max_new_tokens"]
            ours = sglang_generated(case["prompt"], case["gen"], CONTEXT, reserve=reserve,
                                    max_total_tokens=case.get("max_total_tokens"), page_size=rc.page_size)
            assert ours == sglang, (name, case, got)
    # every kind of outcome was met: served in full, cut short, refused by the tokenizer, aborted by the scheduler
    outcomes = {("refused" if v["refused"] else "aborted" if v["aborted"] else "cut" if v["max_new_tokens"] < c["gen"]
                 else "full") for _, cases in configs.values() for c in cases for v in [verdicts[c["id"]]]}
    assert outcomes == {"full", "cut", "refused", "aborted"}


def test_check_context_refuses_exactly_what_sglang_would_not_serve_in_full(sglang_verdicts):
    configs, verdicts = sglang_verdicts
    checked = 0
    for rc, cases in configs.values():
        for case in (c for c in cases if "max_total_tokens" not in c):
            got = verdicts[case["id"]]
            full = not got["refused"] and not got["aborted"] and got["max_new_tokens"] == case["gen"]
            point = dataclasses.replace(rc, probe=dataclasses.replace(rc.probe, context_len=case["prompt"],
                                                                      gen_tokens=case["gen"]))
            assert (check_context(point) is None) == full, (rc.drafter.name, case, got)
            checked += 1
    assert checked == len(configs) * 6


def test_the_reference_engine_keeps_its_own_edge():
    """prompt + gen == context is served by the reference engine (workers/reference/engine.py `check`), so it stays
    allowed there: `make run` probes 8160 + 32 on SmolLM2's 8192."""
    rc = _compose(["model=smollm2-135m", "context_len=8160", "gen_tokens=32"])
    assert check_context(rc) is None
    assert check_context(dataclasses.replace(rc, probe=dataclasses.replace(rc.probe, context_len=8161))) is not None


def test_the_sglang_lines_the_rule_cites():
    from tests.workers.sglang.source import sglang_line, sglang_root

    _require(sglang_root() is not None, "sglang is not installed (see docs/sglang.md)")
    assert sglang_line("srt/managers/tokenizer_manager.py", "if input_token_num >= self.context_len:") == 1338
    assert sglang_line("srt/managers/utils.py", "def compute_num_reserved_tokens") == 484
    assert sglang_line("srt/managers/tp_worker.py", "            kv_capacity - 1,") == 570  # max_req_len = min(...)
    assert sglang_line("srt/managers/scheduler.py", "self.max_req_len - input_len - 1,") == 2714
    assert sglang_line("srt/mem_cache/allocator/base.py", "def max_new_tokens_for_memory") == 88
    assert sglang_line("srt/managers/utils.py", "if len(req.origin_input_ids) >= max_req_input_len:") == 272
