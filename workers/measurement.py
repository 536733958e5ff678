"""A run's metrics from the engine's answers: what one /generate says (`measure`), and what a run's
probe.concurrency answers say together (`measure_all`).

    Measurement: metrics (docs/sglang.md names), series ({"commit_len": [...], "accept_at_depth": [...]}), artifacts
        ({"continuation.txt", "steps.csv", "output_ids.json"}), the accepted-drafts histogram and the
        (accepted, proposed) draft counts where the engine counts them.
    measure(gen, expect_spec) -> Measurement
        The speculative headline figures (commit_len_mean, emitted_per_verify, engine_accept_length, accept_rate,
        the histogram and accept_at_depth) come from SGLang's meta_info fields on every engine, through one function
        (workers.meta_info.spec_metrics_from_meta_info); the reference engine's extra `spec_steps` give only the
        commit_len series, tree shape, verify_forward_median_ms and steps.csv (the headline verify_step_ms comes
        from /metrics counters on both engines: workers.engine_counters, set by the runner). "output_ids.json" holds
        the output token ids, and without speculation at temperature 0 the top-2 logprobs of each position
        (specsweep_common.greedy_output), what the diagnosis' lossless check compares.
    measure_all(gens, expect_spec, wall_s) -> Measurement
        per-request means, commit over all verify steps, throughput_tok_s.

No I/O: the answers come from workers.http_client, sent by workers.probe. An answer without the fields a metric
needs raises BadResponse (workers.errors).
"""

from __future__ import annotations

import csv
import io
import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from specsweep_common.greedy_output import OUTPUT_IDS_ARTIFACT, GreedyOutput, parse_top2
from workers.derived import repeat_frac
from workers.errors import BadResponse
from workers.http_client import Generation
from workers.meta_info import spec_metrics_from_meta_info

_STEP_FIELDS = ("accept_len", "tree_depth", "tree_nodes", "verify_s")


@dataclass
class Measurement:
    metrics: dict[str, float]
    series: dict[str, list[float]] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    engine_time_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    histogram: list[float] = field(default_factory=list)  # verify steps that accepted k drafts, by k
    drafts: tuple[float, float] | None = None  # (accepted, proposed) drafts, where the engine counts them


def meta_number(meta: dict, key: str) -> float:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadResponse(f"meta_info.{key} is missing or not a number: {v!r}")
    return float(v)


def accept_at_depth(histogram: list[float]) -> list[float]:
    """[fraction of verify steps that accepted >= d drafts, for d = 1 .. len - 1] from counts by k accepted."""
    total = sum(histogram)
    return [sum(histogram[d:]) / total for d in range(1, len(histogram))] if total else []


def _depth_metrics(out: Measurement, max_depth: int | None) -> None:
    """series accept_at_depth and depth_accept_rate (mean accepted drafts / max_depth) from out.histogram."""
    depth = accept_at_depth(out.histogram)
    if depth:
        out.series["accept_at_depth"] = depth
        if max_depth:
            out.metrics["depth_accept_rate"] = sum(depth) / max_depth  # = sum_k k * hist[k] / steps / max_depth


def measure(gen: Generation, expect_spec: bool, *, version: str | None = None,
            max_depth: int | None = None) -> Measurement:
    """The run's metrics (docs/sglang.md) from one /generate. `expect_spec`: the server speculates, so spec fields must be there."""
    meta = gen.meta_info
    prompt_tokens = meta_number(meta, "prompt_tokens")
    completion = meta_number(meta, "completion_tokens")
    e2e = float(meta["e2e_latency"]) if isinstance(meta.get("e2e_latency"), (int, float)) else gen.client_e2e_s
    ttft = next((float(meta[k]) for k in ("ttft", "ttft_s", "first_token_latency")
                 if isinstance(meta.get(k), (int, float))), gen.client_ttft_s)
    m: dict[str, float] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "e2e_s": e2e,
                           "continuation_repeat_frac": repeat_frac(gen.text)}  # a looping continuation
    if ttft is not None:
        m["ttft_s"] = ttft
        if completion > 1 and e2e > ttft:
            m["decode_tok_s"] = (completion - 1) / (e2e - ttft)
    out = Measurement(metrics=m, engine_time_s=gen.client_e2e_s)
    out.artifacts["continuation.txt"] = gen.text
    out.artifacts[OUTPUT_IDS_ARTIFACT] = greedy_output(gen).to_json()

    if expect_spec and "spec_verify_ct" not in meta:
        raise BadResponse("speculating server sent no meta_info.spec_verify_ct")
    # The headline figures, on every engine, from SGLang's fields (workers.meta_info: formulas, SGLang lines)
    spec = spec_metrics_from_meta_info(meta, version)
    if expect_spec and spec.metrics.get("verify_steps") and "commit_len_mean" not in spec.metrics:
        raise BadResponse(f"speculating server sent spec_verify_ct but no correct-draft count: {str(meta)[:200]}")
    m.update({k: v for k, v in spec.metrics.items() if k not in ("accepted_drafts", "proposed_drafts")})
    out.histogram = spec.histogram
    if spec.metrics.get("proposed_drafts"):
        out.drafts = (spec.metrics.get("accepted_drafts", 0.0), spec.metrics["proposed_drafts"])
    elif isinstance(meta.get("spec_accept_rate"), (int, float)):
        m["accept_rate"] = float(meta["spec_accept_rate"])
    # The reference engine's extra per-step record: the commit_len series, tree shape, step times
    steps = meta.get("spec_steps")
    if steps:
        if not isinstance(steps, list) or not all(isinstance(s, dict) and "accept_len" in s for s in steps):
            raise BadResponse(f"meta_info.spec_steps is malformed: {str(steps)[:200]}")
        out.series["commit_len"] = [float(s["accept_len"]) for s in steps]
        for key, name in (("tree_depth", "tree_depth_mean"), ("tree_nodes", "tree_nodes_mean")):
            vals = [float(s[key]) for s in steps if isinstance(s.get(key), (int, float))]
            if vals:
                m[name] = statistics.fmean(vals)
        verify = [float(s["verify_s"]) for s in steps if isinstance(s.get("verify_s"), (int, float))]
        if verify:  # an extra: the headline verify_step_ms is workers.engine_counters' (both engines)
            m["verify_forward_median_ms"] = 1000.0 * statistics.median(verify)
        out.artifacts["steps.csv"] = _steps_csv(steps)
    _depth_metrics(out, max_depth)
    return out


def greedy_output(gen: Generation) -> GreedyOutput:
    """The output ids, with the top-2 logprobs of each position when they were asked for (BadResponse when the
    answer lacks them: SGLang's output_top_logprobs is a list per output token of [logprob, token_id, text]
    entries, best first, tokenizer_manager.py:3118-3136, 3104-3108)."""
    if gen.top_logprobs_num is None:
        return GreedyOutput(tuple(gen.output_ids))
    top = gen.meta_info.get("output_top_logprobs")
    if not isinstance(top, list) or len(top) != len(gen.output_ids):
        raise BadResponse(f"asked for top_logprobs_num={gen.top_logprobs_num} but meta_info.output_top_logprobs has "
                          f"{len(top) if isinstance(top, list) else repr(top)[:80]} entries for "
                          f"{len(gen.output_ids)} output tokens")
    try:
        top2 = tuple(parse_top2(pos, i) for i, pos in enumerate(top))
    except ValueError as e:
        raise BadResponse(f"meta_info.output_top_logprobs: {e}") from e
    for i, (((lp1, best), (lp2, _)), tok) in enumerate(zip(top2, gen.output_ids)):
        if best != tok and lp1 != lp2:  # greedy emits the best (either of two equal ones)
            raise BadResponse(f"output token {i} is {tok} but the best of output_top_logprobs is {best} "
                              f"({top2[i]}): not a greedy answer")
    return GreedyOutput(tuple(gen.output_ids), top2)


def _steps_csv(steps: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("step",) + _STEP_FIELDS)
    for i, s in enumerate(steps):
        w.writerow((i,) + tuple(s.get(k, "") for k in _STEP_FIELDS))
    return buf.getvalue()


def measure_all(gens: list[Generation], expect_spec: bool, wall_s: float, *, version: str | None = None,
                max_depth: int | None = None) -> Measurement:
    """The metrics of one run's probe.concurrency answers (`measure` of each, combined).

    Per-request figures (prompt/completion tokens, ttft_s, e2e_s, decode_tok_s, verify_steps, tree shape,
    continuation_repeat_frac) are
    means over requests; commit_len_mean, emitted_per_verify, engine_accept_length and accept_rate are taken over
    all requests' verify steps and drafts;
    verify_forward_median_ms (reference engine) is the median batched verify forward over every step.
    Aggregate: `requests`, `wall_s` (first send to last answer)
    and `throughput_tok_s` = all completion tokens / wall_s (for one request, its completion tokens / its
    client-side time). `batch_size_mean`: requests per verify step, from the reference engine's spec_steps.
    The commit_len series, steps.csv and continuation.txt are request 0's."""
    parts = [measure(g, expect_spec, version=version) for g in gens]
    out = Measurement(metrics={}, engine_time_s=wall_s, series=parts[0].series, artifacts=parts[0].artifacts)
    m = out.metrics
    for key in ("prompt_tokens", "completion_tokens", "ttft_s", "e2e_s", "decode_tok_s", "verify_steps",
                "tree_depth_mean", "tree_nodes_mean", "continuation_repeat_frac"):
        values = [p.metrics[key] for p in parts if key in p.metrics]
        if values:
            m[key] = statistics.fmean(values)
    for key in ("commit_len_mean", "emitted_per_verify", "engine_accept_length"):  # per verify step: over all steps
        per_step = [(p.metrics[key], p.metrics["verify_steps"]) for p in parts
                    if key in p.metrics and p.metrics.get("verify_steps")]
        if per_step:
            m[key] = sum(c * v for c, v in per_step) / sum(v for _, v in per_step)
    drafts = [p.drafts for p in parts if p.drafts is not None]
    if len(drafts) == len(parts) and sum(d[1] for d in drafts) != 0:
        m["accept_rate"] = sum(d[0] for d in drafts) / sum(d[1] for d in drafts)
    elif any("accept_rate" in p.metrics for p in parts):
        m["accept_rate"] = statistics.fmean(p.metrics["accept_rate"] for p in parts if "accept_rate" in p.metrics)
    steps = [s for g in gens for s in (g.meta_info.get("spec_steps") or [])]
    step_s = [float(s["verify_s"]) for s in steps if isinstance(s.get("verify_s"), (int, float))]
    if step_s:
        m["verify_forward_median_ms"] = 1000.0 * statistics.median(step_s)
    batch = [float(s["batch_size"]) for s in steps if isinstance(s.get("batch_size"), (int, float))]
    if batch:
        m["batch_size_mean"] = statistics.fmean(batch)
    out.histogram = [sum(x) for x in itertools.zip_longest(*(p.histogram for p in parts), fillvalue=0.0)]
    _depth_metrics(out, max_depth)
    m["requests"] = float(len(gens))
    m["wall_s"] = wall_s
    completion = sum(p.metrics["completion_tokens"] for p in parts)
    if wall_s > 0:
        m["throughput_tok_s"] = completion / wall_s
    return out
