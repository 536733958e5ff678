"""A tune's edge to the sweep machinery and the MLflow store: its own run, its rounds, the records read back.

    TuneRun(settings, plan, study_name)       the tune's MLflow run (created, or found again on resume)
        .run_round(configs, label) -> {run_hash: Record}   one sweep (session.sweep.sweep_plan) nested under it
        .records(hashes) -> {run_hash: Record}               FINISHED child runs of the experiment, by run_hash
        .log_answer(files, metrics, tags)                    the answer's artifacts, metrics and tags
        .end(state)

Each round is an ordinary sweep: validated configs -> `plan_sweep` (one server per distinct server configuration,
each candidate's batch sizes and contexts on it) -> `sweep_plan` (resume skips FINISHED run hashes, claims, Ray,
MLflow child runs). Its parent run is nested under the tune's run, so the MLflow UI shows tune -> rounds -> runs.
The values are always read back from the store, so a resumed tune and a fresh one read them the same way.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from orchestrator.config.plan import Plan, plan_sweep
from orchestrator.config.settings import ExecutionSettings
from specsweep_common.spec import RunState

if TYPE_CHECKING:
    from orchestrator.config.run_config import RunConfig

log = logging.getLogger(__name__)

TUNE_ROLE = "tune"
STUDY_TAG = "tune.study"
ROUND_TAG = "tune.round"
REPEATS_SUFFIX = ".repeats"  # workers/repeats.py REPEATS_TAG: a metric's values over probe.repeats, a JSON list


@dataclass(frozen=True)
class Record:
    """One FINISHED child run as the tune reads it."""

    run_id: str
    metrics: Mapping[str, float]
    tags: Mapping[str, str] = field(default_factory=dict)

    def repeats(self, metric: str) -> list[float]:
        """The metric's values over the run's repeats (one value for a run of one repeat)."""
        raw = self.tags.get(metric + REPEATS_SUFFIX)
        if raw:
            return [float(v) for v in json.loads(raw)]
        return [float(self.metrics[metric])] if metric in self.metrics else []


class TuneRun:
    def __init__(self, settings: ExecutionSettings, plan: Plan, study_name: str, *, params: Mapping[str, str]):
        from orchestrator.results.tracking import ROLE_TAG, Tracker, experiment_for

        self.settings = settings
        self.experiment = experiment_for(settings, plan)
        self.tracker = Tracker(settings.tracking_uri, self.experiment)
        client = self.tracker.client
        found = client.search_runs([self.tracker.experiment_id],
                                   filter_string=f"tags.`{STUDY_TAG}` = '{study_name}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
            log.info("resume: tune run %s of study %r", self.run_id, study_name)
        else:
            run = client.create_run(self.tracker.experiment_id, run_name=f"tune {study_name}",
                                    tags={ROLE_TAG: TUNE_ROLE, STUDY_TAG: study_name})
            self.run_id = run.info.run_id
            for key, value in params.items():
                client.log_param(self.run_id, key, value[:6000])
        self.job_index = 0

    def run_round(self, configs: Sequence[RunConfig], label: str) -> dict[str, Record]:
        """One sweep of `configs` nested under the tune's run; the FINISHED records of its points."""
        from orchestrator.results.tracking import PARENT_TAG
        from orchestrator.session.sweep import sweep_plan

        plan = plan_sweep(configs[0].sweep_name, configs, first_job_index=self.job_index)
        self.job_index += len(configs)
        log.info("tune %s: %d run(s) on %d server(s)", label, plan.num_runs, len(plan.groups))
        sweep_plan(plan, self.settings, parent_tags={PARENT_TAG: self.run_id, ROUND_TAG: label})
        return self.records(plan.run_hashes)

    def records(self, hashes: Sequence[str]) -> dict[str, Record]:
        from orchestrator.results.tracking import ROLE_TAG

        want = set(hashes)
        out: dict[str, Record] = {}
        runs = self.tracker._search(f"attributes.status = 'FINISHED' and tags.`{ROLE_TAG}` = 'child'")
        for r in sorted(runs, key=lambda r: r.info.start_time or 0):  # the latest record of a point wins
            h = r.data.tags.get("run_hash")
            if h in want:
                out[h] = Record(r.info.run_id, dict(r.data.metrics), dict(r.data.tags))
        return out

    def log_answer(self, files: Mapping[str, str], metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        client = self.tracker.client
        for name, text in files.items():
            client.log_text(self.run_id, text, f"tune/{name}")
        now = int(time.time() * 1000)
        for key, value in metrics.items():
            client.log_metric(self.run_id, key, value, timestamp=now)
        for tag, text in tags.items():
            client.set_tag(self.run_id, tag, text[:5000])

    def log_figure(self, figure: object, name: str) -> None:
        self.tracker.client.log_figure(self.run_id, figure, f"tune/{name}")

    def end(self, state: RunState) -> None:
        self.tracker.client.set_terminated(self.run_id, status=state.value)
