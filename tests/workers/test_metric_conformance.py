"""Metric conformance: the reference engine answers as SGLang 0.5.23 does, and every metric the project derives from
`meta_info` comes out the same, by one code path, from either engine's answer.

Each scenario is a scripted request: max_new_tokens, an EOS position (or none), and the number k of drafts each
verify step accepts (4 drafts a step, speculative_num_draft_tokens = 5). Both engines play it:

- SGLang: its own counting code from the installed wheel, run on CPU (tests/workers/sglang/source.py; its modules
  do not import here): the prefill's first token (`batch_result_processor.py:365-369`), per verify step
  `SchedulerBatchResultProcessor._resolve_spec_v2_tokens` (which counts the step and its correct drafts,
  `batch_result_processor.py:770-846`) then the decode loop's commit and `Req.update_finish_state`
  (`batch_result_processor.py:1046-1049`, `schedule_batch.py:2007-2042`), completion_tokens as
  `len(req.output_ids_through_stop)` (`output_streamer.py:490,522-526`), the meta_info fields by
  `TokenizerManager._calculate_spec_decoding_metrics` (`tokenizer_manager.py:3138-3210`, `get_spec()` replaced
  by an object carrying speculative_num_draft_tokens), and the /server_info window by
  `SchedulerMetricsReporter.{update_spec_metrics,report_decode_stats,reset_metrics}` and
  `SchedulerInternalStateController._average_accept_length`.
- The reference engine: the real one (workers/reference, `tiny` with dummy weights, CPU, NGRAM settings), whose
  drafter is replaced by one that proposes the target's own greedy continuation with its (k+1)-th draft wrong, so
  the real verify accepts exactly k drafts. Everything else (prefill, batched verify, finish, meta_info, flush,
  the accept-length window) is the engine's own code.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import SimpleNamespace as NS

import pytest
import torch

from orchestrator.results.diagnosis import RunRow, find_oracle_shortfall
from orchestrator.config.settings import Thresholds
from workers.http_client import Generation
from workers.measurement import accept_at_depth, measure, measure_all
from workers.reference.args import parse_args
from workers.reference.engine import Engine, SamplingParams
from workers.reference.speculative import Drafter, DraftTree

from tests.workers.sglang.source import sglang_defs, sglang_line, sglang_root

NUM_STEPS = 4
NUM_DRAFT_TOKENS = NUM_STEPS + 1  # root + a chain of 4 drafts, as SGLang's EAGLE with topk 1
WINDOW = 3  # --decode-log-interval for the window test (SGLang's default is 40)
ENGINE_FLAGS = ["--model-path", "tiny", "--load-format", "dummy", "--context-length", "2048"]
PROMPT_TEXT = "The cat sat on the mat. " * 4

pytestmark = pytest.mark.skipif(sglang_root() is None, reason="sglang is not installed (docs/sglang.md, Install)")


@dataclass(frozen=True)
class Scenario:
    name: str
    script: tuple[int, ...]  # drafts accepted by verify step i
    max_new_tokens: int
    eos_at: int | None  # output position of the EOS token (the greedy token there becomes the EOS), None: ignore_eos
    # what SGLang's counting gives (worked out by hand below, checked against SGLang's code)
    verify_ct: int
    correct: int
    completion: int
    histogram: tuple[int, ...]
    finish: str
    tree_drafts: int = NUM_STEPS  # drafts the reference engine's drafter proposes a step (NGRAM may find fewer)


SCENARIOS = [
    # 1 + 7 x 5 = 36 tokens committed, 32 sent: the old (completion - 1) / verify_ct read 31 / 7 = 4.43
    Scenario("oracle-overshoot", (4,) * 8, 32, None, 7, 28, 32, (0, 0, 0, 0, 7), "length"),
    # 1 + 1 + 4 + 2 + 5 + 3 = 16, then a step of 5 reaches 21 > 20
    Scenario("mixed-overshoot", (0, 3, 1, 4, 2, 4, 4), 20, None, 6, 14, 20, (1, 1, 1, 1, 2), "length"),
    Scenario("exact-fit", (4, 4, 4, 4, 4), 21, None, 4, 16, 21, (0, 0, 0, 0, 4), "length"),
    # histogram as long as the largest k seen + 1 (2), not num_steps + 1
    Scenario("short-histogram", (1, 0, 1, 1, 1), 7, None, 4, 3, 7, (1, 3), "length"),
    # the EOS is the first token of step 3's run (positions 9-13): cut at 10, step 3 counted in full
    Scenario("eos-in-run", (2, 4, 4, 4), 40, 9, 3, 10, 10, (0, 0, 1, 0, 2), "stop"),
    # the EOS lies in step 2's overshoot, past max_new_tokens = 8: a length finish at 8
    Scenario("eos-past-cap", (4, 4, 4), 8, 9, 2, 8, 8, (0, 0, 0, 0, 2), "length"),
    Scenario("prefill-only", (), 1, None, 0, 0, 1, (), "length"),
    # trees of 2 drafts where 4 fit: SGLang's proposed count is still 5 steps x 4 (tokenizer_manager.py:3156)
    Scenario("short-trees", (2, 1, 2, 0, 2, 2), 12, None, 5, 7, 12, (1, 1, 3), "length", tree_drafts=2),
]
BY_NAME = {s.name: s for s in SCENARIOS}


# ---------------------------------------------------------------- SGLang's code


class SGLangCode:
    """SGLang 0.5.23's request, result-processor, tokenizer-manager and metrics-reporter code for one server."""

    def __init__(self, decode_log_interval: int = WINDOW):
        spec = NS(speculative_num_draft_tokens=NUM_DRAFT_TOKENS, speculative_num_steps=NUM_STEPS,
                  speculative_algorithm="EAGLE")
        req = sglang_defs("srt/managers/schedule_batch.py", [
            "BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_MATCHED_STR", "FINISHED_MATCHED_REGEX",
            "FINISH_LENGTH", "Req.update_spec_correct_drafts_histogram", "Req.update_finish_state",
            "Req._cap_finished_len_at_max_new_tokens", "Req._check_vocab_boundary_finish",
            "Req._check_str_based_finish", "Req._check_token_based_finish", "Req.finished",
            "Req.output_ids_through_stop"], {})
        self.Req = type("Req", (), {q.split(".")[1]: f for q, f in req.items() if q.startswith("Req.")})
        self.resolve = sglang_defs("srt/managers/scheduler_components/batch_result_processor.py", [
            "_get_speculative_output_stride", "SchedulerBatchResultProcessor._resolve_spec_v2_tokens"],
            {})["SchedulerBatchResultProcessor._resolve_spec_v2_tokens"]
        self.spec_metrics = sglang_defs("srt/managers/tokenizer_manager.py", [
            "TokenizerManager._calculate_spec_decoding_metrics"],
            {"get_spec": lambda: spec, "_ragged_verify_cap_accept": lambda: False}
        )["TokenizerManager._calculate_spec_decoding_metrics"]
        self.generated = sglang_defs("srt/managers/utils.py", ["GenerationBatchResult.get_num_generated_tokens"],
                                     {})["GenerationBatchResult.get_num_generated_tokens"]
        self.average = sglang_defs("srt/managers/scheduler_components/internal_state.py", [
            "SchedulerInternalStateController._average_accept_length"],
            {})["SchedulerInternalStateController._average_accept_length"]
        reporter = sglang_defs("srt/managers/scheduler_components/metrics_reporter.py", [
            "SchedulerMetricsReporter.update_spec_metrics", "SchedulerMetricsReporter.reset_metrics",
            "SchedulerMetricsReporter.report_decode_stats"],
            {"get_spec": lambda: spec, "time": time, "logger": logging.getLogger("sglang-code"),
             "RECORD_STEP_TIME": False, "LOG_FORWARD_ITERS": False, "ENABLE_METRICS_DEVICE_TIMER": False,
             "DisaggregationMode": NS(DECODE="decode"), "get_disagg": lambda: NS(language_only=False)})
        self.reporter = type("Reporter", (), {q.split(".")[1]: f for q, f in reporter.items()})()
        self.scheduler = NS(
            spec_algorithm=NS(is_none=lambda: False, is_dspark=lambda: False), forward_ct=0,
            pool_stats_observer=NS(get_pool_stats=lambda: NS(get_decode_usage_msg_parts=lambda: [])),
            disaggregation_mode=None, waiting_queue=[], kv_events_publisher=NS(publish_kv_events=lambda: None),
            metrics_reporter=self.reporter)
        r = self.reporter  # SchedulerMetricsReporter's attributes report_decode_stats reads, metrics export off
        r.scheduler, r.decode_log_interval, r.is_stats_logging_rank = self.scheduler, decode_log_interval, True
        r.current_scheduler_metrics_enabled, r.enable_mfu_metrics, r._graph_backend_label = False, False, "cuda graph"
        r.last_decode_stats_tic, r.step_time_dict = time.perf_counter(), {}
        r.reset_metrics()
        self.processor = NS(metrics_reporter=NS(snapshot_spec_decode_metrics=lambda batch, result: None),
                            model_worker=NS(on_verify_complete_cpu=lambda *a, **k: None),
                            advance_grammar_fsm=lambda result, batch: None)

    def new_req(self, max_new_tokens: int, eos: int | None):
        req = self.Req()
        req.output_ids, req.finished_len, req.finished_reason, req.to_finish, req.grammar = [], None, None, None, None
        req.sampling_params = NS(max_new_tokens=max_new_tokens, ignore_eos=eos is None, stop_token_ids=set(),
                                 stop_strs=[], stop_regex_strs=[])
        req.eos_token_ids, req.tokenizer, req.vocab_size = ({eos} if eos is not None else set()), None, 259
        req.spec_verify_ct, req.spec_num_correct_drafts, req.spec_correct_drafts_histogram = 0, 0, []
        req.is_retracted, req.kv = False, NS(kv_committed_len=0)
        return req

    def generate(self, greedy: list[int], script: tuple[int, ...], max_new_tokens: int,
                 eos: int | None) -> tuple[list[int], dict]:
        """One request whose verify step i commits greedy's next script[i] + 1 tokens: (output_ids, meta_info)."""
        req = self.new_req(max_new_tokens, eos)
        req.output_ids.append(greedy[0])  # the prefill's token
        req.update_finish_state()
        for k in script:
            if req.finished():
                break
            pos = len(req.output_ids)
            run = greedy[pos:pos + k + 1]
            result = NS(next_token_ids=torch.tensor(run + [0] * (NUM_DRAFT_TOKENS - len(run))),
                        accept_lens=torch.tensor([k + 1]), num_non_draft_tokens_per_req=1, block_accept_lens=None,
                        cap_lens=None, speculative_output_stride=None, speculative_num_draft_tokens=NUM_DRAFT_TOKENS,
                        grammar_retained_tokens=None)
            batch = NS(reqs=[req], forward_iter=None)
            tokens = self.resolve(self.processor, result, batch)[0]
            self._decode_iteration(batch, result)
            req.output_ids.extend(tokens)
            req.update_finish_state(len(tokens))
        assert req.finished(), "the script ran out before the request finished"
        ids = list(req.output_ids_through_stop)
        recv = NS(spec_verify_ct=[req.spec_verify_ct], spec_num_correct_drafts=[req.spec_num_correct_drafts],
                  completion_tokens=[len(ids)], spec_correct_drafts_histogram=[req.spec_correct_drafts_histogram],
                  spec_num_cap_tokens=[0], spec_num_block_accept_tokens=[0], spec_cap_lens_histogram=[[]])
        meta = {"prompt_tokens": 96, "completion_tokens": len(ids), "finish_reason": req.finished_reason.to_json()}
        self.spec_metrics(None, meta, recv, 0)
        return ids, meta

    def _decode_iteration(self, batch, result) -> None:
        """`process_batch_result_decode`'s metrics lines (batch_result_processor.py:983-992, 1102-1108)."""
        bs = len(batch.reqs)
        n = self.generated(result, bs)
        self.reporter.num_generated_tokens += n
        self.reporter.update_spec_metrics(bs, result.num_correct_drafts, num_accept_tokens=n)
        self.reporter.forward_ct_decode = (self.reporter.forward_ct_decode + 1) % (1 << 30)
        self.reporter.report_decode_stats(False, running_batch=batch, num_generated_tokens=n)

    def avg_spec_accept_length(self) -> float | None:
        return self.average(NS(scheduler=self.scheduler))

    def flush(self) -> None:
        self.reporter.reset_metrics()  # what Scheduler.flush_cache does to it (scheduler.py:5528)


# ---------------------------------------------------------------- the reference engine


class ScriptedDrafter(Drafter):
    """Proposes a chain of `drafts` drafts: the target's greedy continuation, the (k+1)-th draft made wrong."""

    def __init__(self, prompt_len: int, greedy: list[int], script: tuple[int, ...], vocab_size: int, drafts: int):
        self.prompt_len, self.greedy, self.script, self.vocab_size = prompt_len, greedy, script, vocab_size
        self.drafts = drafts

    def start(self, prompt, target_seq=None):
        return {"step": 0}

    def propose(self, states, contexts):
        trees = []
        for state, context in zip(states, contexts):
            pos = len(context) - self.prompt_len  # tokens generated so far (untruncated)
            k = self.script[state["step"]]
            state["step"] += 1
            drafts = self.greedy[pos:pos + self.drafts]
            if k < self.drafts:
                drafts = drafts[:k] + [(drafts[k] + 1) % self.vocab_size] * (self.drafts - k)
            trees.append(DraftTree([context[-1]] + drafts, list(range(-1, self.drafts))))
        return trees


@pytest.fixture(scope="module")
def engines():
    """(plain engine, speculating engine, prompt ids, the target's greedy continuation of 64 tokens)."""
    plain = Engine(parse_args(ENGINE_FLAGS))
    spec = Engine(parse_args([*ENGINE_FLAGS, "--speculative-algorithm", "NGRAM", "--speculative-num-steps",
                              str(NUM_STEPS), "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
                              str(NUM_DRAFT_TOKENS), "--decode-log-interval", str(WINDOW)]))
    assert spec.num_draft_tokens == NUM_DRAFT_TOKENS
    try:
        prompt = plain.encode(PROMPT_TEXT)
        greedy = plain.generate(prompt, SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)).output_ids
        assert greedy[9] not in greedy[:9], "the EOS scenarios need a token first seen at position 9"
        yield plain, spec, prompt, greedy
    finally:
        plain.close()
        spec.close()


def reference_generate(engines, s: Scenario) -> tuple[list[int], dict]:
    _, spec, prompt, greedy = engines
    spec.drafter = ScriptedDrafter(len(prompt), greedy, s.script, spec.config.vocab_size, s.tree_drafts)
    eos_id = spec.eos_id
    if s.eos_at is not None:
        spec.eos_id = greedy[s.eos_at]
    try:
        out = spec.generate(prompt, SamplingParams(max_new_tokens=s.max_new_tokens, temperature=0.0,
                                                   ignore_eos=s.eos_at is None))
    finally:
        spec.eos_id = eos_id
    return out.output_ids, out.meta_info


@pytest.fixture(scope="module")
def answers(engines):
    """{(engine, scenario name): (output_ids, meta_info)} for both engines and every scenario."""
    greedy = engines[3]
    sglang = SGLangCode()
    out = {}
    for s in SCENARIOS:
        eos = greedy[s.eos_at] if s.eos_at is not None else None
        out["sglang", s.name] = sglang.generate(greedy, s.script, s.max_new_tokens, eos)
        out["reference", s.name] = reference_generate(engines, s)
    return out


# ---------------------------------------------------------------- the tests

SPEC_FIELDS = {"spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_accept_rate",
               "spec_accept_length", "spec_correct_drafts_histogram"}


@pytest.mark.parametrize("name", BY_NAME)
def test_reference_meta_info_is_sglangs(answers, name):
    """Same output ids, finish_reason, completion_tokens and every speculative field, with SGLang's values."""
    sg_ids, sg = answers["sglang", name]
    ref_ids, ref = answers["reference", name]
    assert ref_ids == sg_ids
    assert ref["finish_reason"] == sg["finish_reason"] and ref["completion_tokens"] == sg["completion_tokens"]
    assert {k for k in ref if k.startswith("spec_")} - {"spec_steps"} == {k for k in sg if k.startswith("spec_")}
    for key in SPEC_FIELDS & set(sg):
        assert ref[key] == pytest.approx(sg[key]), key
    if "spec_steps" in ref:  # the reference engine's extra record agrees with the SGLang fields
        assert [s["accept_len"] - 1 for s in ref["spec_steps"]] == list(BY_NAME[name].script[:sg["spec_verify_ct"]])


@pytest.mark.parametrize("name", BY_NAME)
@pytest.mark.parametrize("engine", ["sglang", "reference"])
def test_every_derived_metric_from_either_engine(answers, engine, name):
    """What the project records from one answer (workers.measurement.measure), against the scenario's counts."""
    s = BY_NAME[name]
    ids, meta = answers[engine, name]
    assert meta["completion_tokens"] == s.completion == len(ids) and meta["finish_reason"]["type"] == s.finish
    out = measure(Generation(text="", output_ids=ids, meta_info=meta, client_ttft_s=0.1, client_e2e_s=1.0),
                  expect_spec=s.verify_ct > 0, max_depth=NUM_STEPS)
    m = out.metrics
    if not s.verify_ct:  # finished at prefill: SGLang sends no speculative field
        assert not SPEC_FIELDS & set(meta) and "commit_len_mean" not in m and out.histogram == []
        return
    proposed = s.verify_ct * (NUM_DRAFT_TOKENS - 1)
    assert meta["spec_num_proposed_drafts"] == proposed
    assert m["verify_steps"] == s.verify_ct and m["completion_tokens"] == s.completion
    assert m["commit_len_mean"] == pytest.approx(1 + s.correct / s.verify_ct)
    assert m["emitted_per_verify"] == pytest.approx((s.completion - 1) / s.verify_ct)
    assert m["engine_accept_length"] == pytest.approx(s.completion / s.verify_ct)
    assert m["accept_rate"] == pytest.approx(s.correct / proposed) and out.drafts == (s.correct, proposed)
    assert out.histogram == list(s.histogram)
    depth = [sum(s.histogram[d:]) / s.verify_ct for d in range(1, len(s.histogram))]
    assert out.series["accept_at_depth"] == pytest.approx(depth) and accept_at_depth(out.histogram) == depth
    assert m["depth_accept_rate"] == pytest.approx(s.correct / s.verify_ct / NUM_STEPS)
    if engine == "reference":  # the per-step series is the same quantity, step by step
        assert out.series["commit_len"] == [k + 1.0 for k in s.script[:s.verify_ct]]
        assert sum(out.series["commit_len"]) / s.verify_ct == pytest.approx(m["commit_len_mean"])


@pytest.mark.parametrize("engine", ["sglang", "reference"])
def test_oracle_rule_holds_when_the_last_step_overshoots(answers, engine):
    """Rule (a) reads commit_len_mean: 5 on every step, although 32 tokens over 7 steps are 4.43 a step."""
    ids, meta = answers[engine, "oracle-overshoot"]
    gens = [Generation(text="", output_ids=ids, meta_info=meta, client_ttft_s=0.1, client_e2e_s=1.0)] * 2
    m = measure_all(gens, expect_spec=True, wall_s=2.0, max_depth=NUM_STEPS).metrics
    assert m["commit_len_mean"] == NUM_STEPS + 1 and m["emitted_per_verify"] == pytest.approx(31 / 7)
    row = RunRow(run_id="0" * 16, name="oracle", context_len=96, probe="predictable", drafter="oracle",
                 attention="torch", page_size=1, is_oracle=True, num_steps=NUM_STEPS, metrics=m, engine=engine)
    findings, check = find_oracle_shortfall([row], Thresholds())
    assert check.evaluated and findings == []
    old = RunRow(**{**vars(row), "metrics": {**m, "commit_len_mean": m["emitted_per_verify"]}})
    assert find_oracle_shortfall([old], Thresholds())[0]  # what the old formula made of it: a "pipeline bug"


def test_server_accept_length_window_is_sglangs(engines):
    """/server_info's avg_spec_accept_length: complete --decode-log-interval windows since the last flush, absent
    before the first; a flush resets it; the gauge keeps the last complete window."""
    _, spec, prompt, greedy = engines
    sglang = SGLangCode(decode_log_interval=WINDOW)
    spec.flush_cache()
    assert spec.avg_spec_accept_length() is None and sglang.avg_spec_accept_length() is None
    seen = []
    for name in ("short-histogram", "mixed-overshoot", "oracle-overshoot"):  # 4, 6, 7 decode iterations
        s = BY_NAME[name]
        sglang.generate(greedy, s.script, s.max_new_tokens, None)
        reference_generate(engines, s)
        seen.append((spec.avg_spec_accept_length(), sglang.avg_spec_accept_length()))
    # windows of 3 iterations: [2,1,2] | [2,1,4] [2,5,3] | [5,5,5] [5,5,5] (commits of 17 iterations, 15 folded)
    expected = [5 / 3, (5 + 7 + 10) / 9, (5 + 7 + 10 + 15 + 15) / 15]
    for (ref, sg), want in zip(seen, expected):
        assert ref == pytest.approx(want) and sg == pytest.approx(want)
    assert spec.accept_window.last == pytest.approx(5.0)
    spec.flush_cache()
    sglang.flush()
    assert spec.avg_spec_accept_length() is None and sglang.avg_spec_accept_length() is None
    assert spec.accept_window.last == pytest.approx(5.0)  # a gauge: the flush leaves it
    s = BY_NAME["exact-fit"]  # 4 iterations after the flush: only the first 3 count
    sglang.generate(greedy, s.script, s.max_new_tokens, None)
    reference_generate(engines, s)
    assert spec.avg_spec_accept_length() == pytest.approx(5.0) == sglang.avg_spec_accept_length()


CITED = [  # (file under sglang/, line, text on that line): the SGLang lines the project's code and docs cite
    ("srt/managers/tokenizer_manager.py", 3156, "num_proposed_drafts = recv_obj.spec_verify_ct[i] * ("),
    ("srt/managers/tokenizer_manager.py", 3166, 'meta_info["spec_accept_length"] = ('),
    ("srt/managers/scheduler_components/batch_result_processor.py", 832, "req.spec_verify_ct += 1"),
    ("srt/managers/scheduler_components/batch_result_processor.py", 835,
     "req.spec_num_correct_drafts += num_correct_drafts"),
    ("srt/managers/scheduler_components/output_streamer.py", 490, "output_ids_ = req.output_ids_through_stop"),
    ("srt/managers/scheduler_components/output_streamer.py", 522, "self.completion_tokens.append("),
    ("srt/managers/tokenizer_manager.py", 3172, 'meta_info["spec_verify_ct"] = recv_obj.spec_verify_ct[i]'),
    ("srt/managers/schedule_batch.py", 1509, "def output_ids_through_stop(self)"),
    ("srt/managers/schedule_batch.py", 1566, "def update_spec_correct_drafts_histogram"),
    ("srt/managers/schedule_batch.py", 2042, "self.finished_len = self.sampling_params.max_new_tokens"),
    ("srt/managers/scheduler_components/metrics_reporter.py", 708, "def reset_metrics(self):"),
    ("srt/managers/scheduler_components/metrics_reporter.py", 934,
     "if self.forward_ct_decode % self.decode_log_interval != 0:"),
    ("srt/managers/scheduler_components/metrics_reporter.py", 999,
     "self.spec_total_num_accept_tokens += self.spec_num_accept_tokens"),
    ("srt/managers/scheduler_components/internal_state.py", 125, 'state["avg_spec_accept_length"] = accept_length'),
    ("srt/managers/scheduler.py", 5528, "self.metrics_reporter.reset_metrics()"),
    ("srt/observability/metrics_collector.py", 2110, "self.generation_tokens_total.labels(**stream_labels)"),
]


@pytest.mark.parametrize("rel,line,text", CITED)
def test_cited_sglang_lines_hold(rel, line, text):
    assert sglang_line(rel, text) == line
