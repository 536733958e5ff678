"""Every metric a run records, declared once: its unit, where it comes from, which way is better, whether it repeats
exactly, and the views that show it. The lists the rest of the project reads are derived from the rows here:

    SUMMARY_METRICS   the report's "every run" table (report/tables.py), in this order
    KERNEL_METRICS    the kernel runs' table (report/tables.py) and the live display of a kernel sweep
    WATCHED           the regression watch's metrics, +1 / -1 for the better direction (regress/verdict.py)
    EXACT_WATCHED, NOISY_WATCHED   the same, split by how a verdict judges them
    UI_METRICS        the MLflow saved view's columns (ui_view.py)
    PROGRESS_METRICS  the live display's columns of an engine sweep (execution/progress.py)
    HEADLINE_METRICS  the narrow tables: `specsweep-report --compare` (report/compare.py) and the console's table of
                      unfinished runs (report/build.py)

A new metric is one row of CATALOGUE; tests/orchestrator/results/test_metric_catalogue.py holds the lists above,
docs/orchestrator.md's table of a run's metrics and docs/sglang.md's table of the engine's figures to it.

Exact or noisy: an exact metric repeats to the last digit on one engine build (token counts, and the commit length
and accept rate of a temperature-0 probe: the same tokens are drafted and accepted every time); a noisy one is a
clock reading or a rate computed from one, and moves from sweep to sweep with the host's load (regress/verdict.py
judges the two kinds differently).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Source(str, Enum):
    """Where a metric's value is read or computed (the module that writes it)."""

    PROBE = "probe"  # the client's clock and counts of the requests it sent (workers/measurement.py)
    META_INFO = "meta_info"  # the engine's final answer per request (workers/meta_info.py)
    ENGINE_METRICS = "/metrics"  # Prometheus counter deltas over the run (workers/engine_counters.py)
    SERVER_INFO = "/server_info"  # the engine's limits, once per start (workers/engine_counters.py)
    STEPS = "spec_steps"  # the reference engine's per-step extras (workers/measurement.py)
    DERIVED = "derived"  # computed from other metrics and the model's size (workers/derived.py)
    TELEMETRY = "telemetry"  # the GPU's sampled utilisation (workers/telemetry.py)
    KERNEL = "kernel job"  # a verify-kernel benchmark (workers/kernel_job.py)


class View(str, Enum):
    SUMMARY = "summary"
    KERNEL = "kernel"
    UI = "ui"
    PROGRESS = "progress"
    HEADLINE = "headline"


EXACT, NOISY = "exact", "noisy"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    source: Source
    better: int  # +1 higher is better, -1 lower is better, 0 neither (a count, a size)
    nature: str  # EXACT | NOISY
    views: frozenset[View] = frozenset()
    watch: bool = False  # judged by the regression watch (regress/verdict.py)


def _m(name: str, unit: str, source: Source, better: int, nature: str, *views: View, watch: bool = False) -> Metric:
    return Metric(name, unit, source, better, nature, frozenset(views), watch)


S, K, U, P, H = View.SUMMARY, View.KERNEL, View.UI, View.PROGRESS, View.HEADLINE

# In the order the report's table shows them.
CATALOGUE: tuple[Metric, ...] = (
    _m("prompt_tokens", "tokens", Source.PROBE, 0, EXACT, S, P),
    _m("completion_tokens", "tokens", Source.PROBE, 0, EXACT, S),
    _m("commit_len_mean", "tokens / verify step", Source.META_INFO, +1, EXACT, S, U, P, H, watch=True),
    _m("accept_rate", "fraction", Source.META_INFO, +1, EXACT, S, watch=True),
    _m("verify_steps", "steps", Source.META_INFO, 0, EXACT, S),
    _m("ttft_s", "s", Source.PROBE, -1, NOISY, S, P),
    _m("decode_tok_s", "tokens / s", Source.PROBE, +1, NOISY, S, U, P, H, watch=True),
    _m("throughput_tok_s", "tokens / s", Source.PROBE, +1, NOISY, S, watch=True),
    _m("verify_step_ms", "ms", Source.ENGINE_METRICS, -1, NOISY, S, U, P, H, watch=True),
    _m("kv_bw_gbs", "GB / s", Source.DERIVED, +1, NOISY, S),
    _m("roofline_frac", "fraction", Source.DERIVED, +1, NOISY, S, U),
    _m("gpu_util_mean", "%", Source.TELEMETRY, +1, NOISY, S),
    _m("continuation_repeat_frac", "fraction", Source.PROBE, 0, EXACT, S),
    # recorded and documented, in no table
    _m("e2e_s", "s", Source.PROBE, -1, NOISY),
    _m("tree_depth_mean", "tokens", Source.STEPS, 0, EXACT),
    _m("tree_nodes_mean", "tokens", Source.STEPS, 0, EXACT),
    _m("emitted_per_verify", "tokens / verify step", Source.META_INFO, +1, EXACT),
    _m("depth_accept_rate", "fraction", Source.META_INFO, +1, EXACT),
    _m("engine_accept_length", "tokens / verify step", Source.META_INFO, +1, EXACT),
    _m("engine_accept_length_metrics", "tokens / verify step", Source.ENGINE_METRICS, +1, EXACT),
    _m("verify_forward_median_ms", "ms", Source.STEPS, -1, NOISY),
    _m("max_req_input_len", "tokens", Source.SERVER_INFO, 0, EXACT),
    _m("max_total_num_tokens", "tokens", Source.SERVER_INFO, 0, EXACT),
    _m("requests", "requests", Source.PROBE, 0, EXACT),
    _m("wall_s", "s", Source.PROBE, -1, NOISY),
    _m("batch_size_mean", "requests", Source.STEPS, 0, EXACT),
    _m("gpu_mem_peak_gib", "GiB", Source.TELEMETRY, 0, NOISY),
    _m("gpu_power_w_mean", "W", Source.TELEMETRY, 0, NOISY),
    _m("gpu_sm_clock_mhz_mean", "MHz", Source.TELEMETRY, 0, NOISY),
    # kernel jobs (job=kernel): their own table
    _m("time_us", "µs", Source.KERNEL, -1, NOISY, K),
    _m("gbs", "GB / s", Source.KERNEL, +1, NOISY, K),
    _m("floor_frac", "fraction", Source.KERNEL, +1, NOISY, K),
    _m("rel_err", "relative error", Source.KERNEL, -1, NOISY, K),
)

BY_NAME = {m.name: m for m in CATALOGUE}


def in_view(view: View) -> tuple[str, ...]:
    return tuple(m.name for m in CATALOGUE if view in m.views)


SUMMARY_METRICS = in_view(View.SUMMARY)
KERNEL_METRICS = in_view(View.KERNEL)
UI_METRICS = in_view(View.UI)
PROGRESS_METRICS = in_view(View.PROGRESS)
HEADLINE_METRICS = in_view(View.HEADLINE)
WATCHED = {m.name: m.better for m in CATALOGUE if m.watch}
EXACT_WATCHED = {m.name: m.better for m in CATALOGUE if m.watch and m.nature == EXACT}
NOISY_WATCHED = {m.name: m.better for m in CATALOGUE if m.watch and m.nature == NOISY}
