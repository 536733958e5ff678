"""Load curves on Ray, recorded in MLflow.

    run_curves(configs, settings, limits, exec_settings, parent_run_id=None) -> [Curve]

Each configuration's curve is one Ray task placed like the configuration's server would be in a sweep (its CPUs and
GPUs, `orchestrator.execution.preflight.server_needs`), so the engine, and bench_serving beside it, run on the node
that serves (workers/load_curve.py: bench_serving's latencies are client clocks). One configuration at a time: two
curves measured at once would load each other's machine.

Each curve is an MLflow run (role `load`; nested under the tune's run when it follows a tune):
- `load/bench_serving.jsonl`: bench_serving's result file as written (one line per level, with --output-details):
  the raw record;
- `load/requests.jsonl`: the engine's record of each request (its meta_info: spec_verify_ct, completion_tokens, ...),
  with the level it belongs to;
- `load/table.md`, `load/load_curve.png`, `load/accept_length.png` (speculating configurations);
- metrics `load.<level>.<name>` per level (orchestrator/load/curve.py `level_metrics`), e.g.
  `load.c4.p99_tpot_ms`, `load.c4.output_tok_s`, `load.c4.goodput_req_s`, `load.c4.accept_len_p50`;
- on a failure, FAILED with the reason in the tag `load.error` and the engine's log tail.
The report over every curve (`load/report.md`, `load/pareto.png`) goes on the tune's run, or on the curve's own run
when there is one configuration and no tune.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from orchestrator.load import render
from orchestrator.load.curve import Level, level_figures, level_metrics
from orchestrator.load.settings import Limits, LoadSettings, load_spec
from specsweep_common.spec import RunState

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig
    from orchestrator.config.settings import ExecutionSettings

log = logging.getLogger(__name__)

LOAD_ROLE = "load"
CONFIG_TAG = "load.configuration"  # the configuration's overrides (its label)
ERROR_TAG = "load.error"


@dataclass
class Curve:
    label: str
    run_id: str = ""
    levels: list[Level] = field(default_factory=list)
    table: str = ""
    error: str | None = None


def _remote_curve():
    import ray

    from workers.load_curve import run_load_curve

    @ray.remote(max_retries=0)
    def load_curve(server, log_dir, spec):
        from orchestrator.execution.actors import node_tags

        return run_load_curve(server, log_dir, spec, node_tags=node_tags())

    return load_curve


def run_curves(configs: Mapping[str, RunConfig], settings: LoadSettings, lim: Limits,
               exec_settings: ExecutionSettings, *, parent_run_id: str | None = None,
               report_run_id: str | None = None) -> list[Curve]:
    """Every configuration's load curve, one after the other, each recorded as it ends; then the report (tables,
    Pareto chart) on `report_run_id` (None: on the only curve's run when there is one)."""
    import ray

    from orchestrator.config.plan import build_server, plan_sweep
    from workers.load_curve import LoadCurveOutcome
    from orchestrator.execution.preflight import server_needs
    from orchestrator.execution.ray_connection import ray_connection
    from orchestrator.results.tracking import Tracker

    first = next(iter(configs.values()))
    plan = plan_sweep(first.sweep_name, list(configs.values()))
    tracker = Tracker.from_settings(exec_settings, plan)  # the plan's secrets redacted in all it records
    log_dir = _log_dir(exec_settings)
    curves: list[Curve] = []
    with ray_connection(exec_settings.cluster, plan.groups):
        task = _remote_curve()
        for label, rc in configs.items():
            server = build_server(rc)
            spec = load_spec(settings, rc.probe.gen_tokens, lim)
            needs = server_needs(server, exec_settings.cluster)
            curve = Curve(label)
            run_id = _begin(tracker, label, rc, settings, spec, parent_run_id)
            curve.run_id = run_id
            log.info("load curve of %s: %d level(s) (%s) on engine %s", label or "no speculation", len(spec.levels),
                     ", ".join(lv.label for lv in spec.levels), server.engine.kind.value)
            t0 = time.time()
            try:
                outcome = ray.get(task.options(num_cpus=needs.cpus_per_node, num_gpus=needs.gpus_per_node)
                                  .remote(server, str(log_dir), spec))
            except KeyboardInterrupt:
                tracker.client.set_terminated(run_id, status=RunState.KILLED.value)
                raise
            except Exception as e:  # the task itself died (its node, its worker): this curve failed, the next runs
                outcome = LoadCurveOutcome(error=f"the load task failed: {type(e).__name__}: {e}"[:2000])
            gpus = needs.gpus_per_node * server.nnodes
            _record(tracker, curve, outcome, lim, gpus, time.time() - t0)
            curves.append(curve)
    target = report_run_id or (curves[0].run_id if len(curves) == 1 else None)
    if target:
        log_report(tracker, target, curves, lim)
    return curves


def _log_dir(exec_settings: ExecutionSettings):
    from pathlib import Path

    d = Path(exec_settings.work_dir) / "load_logs" / time.strftime("%Y%m%d-%H%M%S")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _begin(tracker, label: str, rc: RunConfig, settings: LoadSettings, spec, parent_run_id: str | None) -> str:
    from orchestrator.results.store_layout import PARENT_TAG, ROLE_TAG

    tags = {ROLE_TAG: LOAD_ROLE, CONFIG_TAG: label or "no speculation", "engine": rc.engine.kind.value}
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    run = tracker.client.create_run(tracker.experiment_id, run_name=settings.name or f"load {label or 'none'}",
                                    tags=tags)
    rid = run.info.run_id
    params = {"load.levels": " ".join(lv.label for lv in spec.levels), "load.prompts": json.dumps(spec.prompts),
              "load.input_len": str(spec.input_len), "load.output_len": str(spec.output_len),
              "load.backend": spec.backend, "load.goodput_ms": json.dumps(dict(spec.goodput_ms)),
              "load.seed": str(spec.seed)}
    params.update({k: str(v) for k, v in rc.params})
    from mlflow.entities import Param

    from specsweep_common.redact import redact_param

    items = [Param(k[:250], redact_param(k, v, tracker.secrets)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        tracker.client.log_batch(rid, params=items[i:i + 100])
    return rid


def _record(tracker, curve: Curve, outcome, lim: Limits, gpus: int, wall_s: float) -> None:
    client, rid = tracker.client, curve.run_id
    requests_out: list[str] = []
    errors = [outcome.error] if outcome.error else []
    for lo in outcome.levels:
        for r in lo.requests:
            requests_out.append(json.dumps({"level": lo.level.label, **r}))
        if lo.error:
            errors.append(f"level {lo.level.label}: {lo.error}")
        if lo.record is not None:
            try:
                curve.levels.append(level_figures(lo.record, lo.requests, lo.level, gpus, lim))
            except (KeyError, TypeError, ValueError) as e:  # a result line without the figures: kept, not read
                errors.append(f"level {lo.level.label}: bench_serving's line lacks {e}")
    if outcome.jsonl:  # its server_info holds the server's arguments: redacted as every text the plan's runs write
        client.log_text(rid, tracker.redact(outcome.jsonl), "load/bench_serving.jsonl")
    if requests_out:
        client.log_text(rid, tracker.redact("\n".join(requests_out) + "\n"), "load/requests.jsonl")
    if errors and outcome.engine_log_tail:
        client.log_text(rid, tracker.redact(outcome.engine_log_tail), "load/engine_log_tail.txt")
    metrics = {k: v for lv in curve.levels for k, v in level_metrics(lv).items()}
    metrics["load.wall_s"] = wall_s
    now = int(time.time() * 1000)
    from mlflow.entities import Metric

    client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    for k, v in outcome.node.items():
        client.set_tag(rid, k, tracker.redact(v))
    if outcome.tokenizer:
        client.set_tag(rid, "load.tokenizer", tracker.redact(outcome.tokenizer))
    if curve.levels:
        curve.table = render.table_markdown(curve.label, curve.levels, lim)
        client.log_text(rid, curve.table, "load/table.md")
        client.log_figure(rid, render.load_curve_figure(curve.label, curve.levels), "load/load_curve.png")
        acc = render.accept_figure({curve.label: curve.levels})
        if acc is not None:
            client.log_figure(rid, acc, "load/accept_length.png")
    if errors:
        curve.error = "; ".join(errors)
        client.set_tag(rid, ERROR_TAG, tracker.redact(curve.error)[:5000])
        log.warning("load curve of %s: %s", curve.label or "no speculation", curve.error)
    client.set_terminated(rid, status=(RunState.FAILED if errors or not curve.levels else RunState.FINISHED).value)
    _close_figures()


def _close_figures() -> None:
    import matplotlib.pyplot as plt

    plt.close("all")


def report_markdown(curves: list[Curve], lim: Limits) -> str:
    limits = ("no latency limits" if lim.source == "none" else
              f"p99 limits ({'the tune' if lim.source == 'tune' else 'the load'}'s): " + ", ".join(
                  x for x in (f"TPOT <= {lim.p99_tpot_ms:g} ms" if lim.p99_tpot_ms is not None else "",
                              f"TTFT <= {lim.p99_ttft_s:g} s" if lim.p99_ttft_s is not None else "") if x))
    parts = ["# Load curves (SGLang bench_serving)", "", f"{limits}.", ""]
    for c in curves:
        parts += [c.table or f"**{c.label or 'no speculation'}**: no level measured ({c.error})", ""]
        if c.error and c.table:
            parts += [f"Errors: {c.error}", ""]
    return "\n".join(parts)


def log_report(tracker, run_id: str, curves: list[Curve], lim: Limits) -> None:
    client = tracker.client
    client.log_text(run_id, report_markdown(curves, lim), "load/report.md")
    measured = {c.label: c.levels for c in curves if c.levels}
    if measured:
        client.log_figure(run_id, render.pareto_figure(measured), "load/pareto.png")
    _close_figures()
