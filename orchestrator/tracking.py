"""MLflow: one experiment per sweep, a parent run per sweep invocation, a child run per RunSpec.

Public API:

    tracker = Tracker(uri: str = "sqlite:///mlflow.db", experiment: str = "default")
    Tracker.from_settings(settings: ExecutionSettings, plan: Plan | None = None) -> Tracker
    experiment_for(settings, plan) -> str      the sweep's experiment: `<name>-stub` for stub-engine sweeps
    tracker.finished_run_hashes() -> set[str]          run_hash tags of FINISHED child runs (resume)
    with tracker.start_parent(plan, *, work_dir=".", multirun_yaml=None, tags=None) as parent_run_id:
        tracker.log_result(result: RunResult) -> str   one child run (status FINISHED / FAILED / KILLED)
        tracker.log_parent_metrics({"engine_starts": 2.0})
    # leaving the block ends the parent: FINISHED, or KILLED on KeyboardInterrupt, FAILED on another exception;
    # tracker.end_parent(status) ends it explicitly (then the block leaves it as is).
    tracker.begin_parent(plan, ...) -> str; tracker.end_parent(status)   the same without a with-block
    finished_run_hashes(settings: ExecutionSettings, plan: Plan | None = None) -> set[str]   helper for the launcher

Experiments. One per sweep: `tracking.experiment_name`, else `sweep_name`. A sweep on the stub engine
(`engine=stub`: simulated commits and timings) records into `<that name>-stub` instead, so its runs never mix with
real results or resume against them; a sweep mixing the stub with a real engine is rejected (`experiment_for`).

Layout. Parent: params = resolved base config flattened (`a.b.c`), `overrides`; tags = `specsweep.role=parent`,
git sha, host, sweep; metrics `runs_planned` (this invocation), `runs_resumed` (skipped: FINISHED earlier);
artifacts = `config.yaml`, `overrides.txt`, `run_hashes.txt` (every point of the sweep, one run_hash a line, resumed
ones included: what the report covers), `multirun.yaml` (given, or found in Hydra's sweep dir). Child:
`mlflow.parentRunId`, run name = RunSpec.name, params = RunSpec.params, tags = run_hash, job_index,
server_group, engine, engine_version, host, git sha, attempt, engine_start, failure_reason; metrics in
`log_batch` calls, the `commit_len` series (and any `metrics.log_patterns` series) with step = index; artifacts = RunResult.artifacts
(continuation text, per-step CSV, engine log tail on failure).

With a `sqlite:` store, artifacts go to `mlartifacts/` next to the database file (never `./mlruns`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from orchestrator.spec import EngineKind, ExecutionSettings, RunResult, RunState

if TYPE_CHECKING:
    from orchestrator.plan import Plan

logger = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
ROLE_TAG = "specsweep.role"
MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value
BATCH_METRICS, BATCH_PARAMS, BATCH_TAGS = 1000, 100, 100  # MLflow's log_batch limits
STUB_EXPERIMENT_SUFFIX = "-stub"
RUN_HASHES_ARTIFACT = "run_hashes.txt"


def experiment_for(settings: ExecutionSettings, plan: Plan | None = None) -> str:
    """The MLflow experiment of `plan`'s sweep: `settings.experiment_name`, plus `-stub` when every run is on the
    stub engine. Raises ValueError for a plan mixing the stub with a real engine."""
    kinds = plan.engine_kinds if plan is not None else frozenset()
    if EngineKind.STUB in kinds and len(kinds) > 1:
        raise ValueError(f"engine.kind={sorted(k.value for k in kinds)}: the stub engine's runs are simulated and "
                         f"recorded in their own experiment; run stub and real engines as separate sweeps")
    return settings.experiment_name + (STUB_EXPERIMENT_SUFFIX if kinds == {EngineKind.STUB} else "")


def _client(uri: str):
    from mlflow import MlflowClient  # ~3 s import: only when tracking is used

    return MlflowClient(tracking_uri=uri)


def artifact_root_for(uri: str) -> str | None:
    """`mlartifacts/` beside a SQLite file; None (the server's choice) otherwise."""
    if uri.startswith("sqlite:///"):
        return str(Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts")
    return None


def git_sha(cwd: str | os.PathLike = ".") -> str:
    """The commit of the specsweep code that ran (its checkout), else of the working directory."""
    for where in (Path(__file__).resolve().parent, Path(cwd)):
        try:
            out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0:
            return out.stdout.strip()
    return "unknown"


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


class Tracker:
    def __init__(self, uri: str = "sqlite:///mlflow.db", experiment: str = "default"):
        self.uri = uri
        self.experiment = experiment
        self.client = _client(uri)
        self.experiment_id = self._experiment_id()
        self.parent_run_id: str | None = None
        self.host = socket.gethostname()
        self.git_sha = "unknown"
        self._parent_ended = False

    @classmethod
    def from_settings(cls, settings: ExecutionSettings, plan: Plan | None = None) -> "Tracker":
        return cls(settings.tracking_uri, experiment_for(settings, plan))

    def _experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            return exp.experiment_id
        root = artifact_root_for(self.uri)
        location = f"{root}/{self.experiment}" if root else None
        try:
            return self.client.create_experiment(self.experiment, artifact_location=location)
        except Exception:  # created concurrently by another driver: use theirs
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    # -- resume

    def finished_run_hashes(self) -> set[str]:
        from mlflow.entities import ViewType

        hashes: set[str] = set()
        token = None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string="attributes.status = 'FINISHED'",
                                           run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
            hashes.update(r.data.tags["run_hash"] for r in page if "run_hash" in r.data.tags)
            token = page.token
            if not token:
                return hashes

    # -- parent

    @contextlib.contextmanager
    def start_parent(self, plan, *, work_dir: str | os.PathLike = ".", multirun_yaml: str | None = None,
                     tags: Mapping[str, str] | None = None) -> Iterator[str]:
        """`plan` is an `orchestrator.plan.Plan` (sweep_name, base_config, overrides, num_runs, run_hashes and
        resumed are read)."""
        rid = self.begin_parent(plan, work_dir=work_dir, multirun_yaml=multirun_yaml, tags=tags)
        try:
            yield rid
        except KeyboardInterrupt:
            self.end_parent(RunState.KILLED)
            raise
        except BaseException:
            self.end_parent(RunState.FAILED)
            raise
        else:
            self.end_parent(RunState.FINISHED)

    def begin_parent(self, plan, *, work_dir: str | os.PathLike = ".", multirun_yaml: str | None = None,
                     tags: Mapping[str, str] | None = None) -> str:
        """Create the parent run (RUNNING) and return its id; `end_parent` closes it."""
        self.git_sha = git_sha(work_dir)
        run = self.client.create_run(
            self.experiment_id, run_name=f"{plan.sweep_name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            tags={ROLE_TAG: "parent", "sweep": plan.sweep_name, "git_sha": self.git_sha, "host": self.host,
                  **schedule_tags(), **dict(tags or {})})
        self.parent_run_id = run.info.run_id
        self._parent_ended = False
        rid = self.parent_run_id
        params = flatten(plan.base_config or {})
        params["overrides"] = " ".join(plan.overrides)
        self._log_batch(rid, params=params, metrics={"runs_planned": float(plan.num_runs),
                                                     "runs_resumed": float(len(plan.resumed))})
        if plan.base_config:
            import yaml

            self.client.log_text(rid, yaml.safe_dump(plan.base_config, sort_keys=False), "config.yaml")
        self.client.log_text(rid, "\n".join(plan.overrides) + "\n", "overrides.txt")
        self.client.log_text(rid, "".join(f"{h}\n" for h in plan.run_hashes), RUN_HASHES_ARTIFACT)
        multirun_yaml = multirun_yaml or _hydra_multirun_yaml()
        if multirun_yaml:
            self.client.log_text(rid, multirun_yaml, "multirun.yaml")
        return rid

    def log_parent_metrics(self, metrics: Mapping[str, float]) -> None:
        if self.parent_run_id:
            self._log_batch(self.parent_run_id, metrics=metrics)

    def end_parent(self, status: RunState | str = RunState.FINISHED) -> None:
        if self.parent_run_id and not self._parent_ended:
            self.client.set_terminated(self.parent_run_id, status=RunState(status).value)
            self._parent_ended = True

    # -- children

    def log_result(self, result: RunResult) -> str:
        spec = result.run
        tags = {ROLE_TAG: "child", "run_hash": spec.run_hash, "job_index": str(spec.job_index),
                "server_group": spec.server.key, "engine": spec.server.engine.kind.value,
                "engine_version": spec.server.engine.version, "host": self.host, "git_sha": self.git_sha,
                "state": result.state.value, **result.tags}
        if result.reason:
            tags["failure_reason"] = result.reason.value
        if result.message:
            tags["message"] = result.message[:5000]
        if self.parent_run_id:
            tags[PARENT_TAG] = self.parent_run_id
        start_ms = int((result.started_at or time.time()) * 1000)
        run = self.client.create_run(self.experiment_id, run_name=spec.name, start_time=start_ms, tags=tags)
        rid = run.info.run_id
        params = {k: v for k, v in spec.params}
        if spec.overrides:
            params.setdefault("overrides", " ".join(spec.overrides))
        self._log_batch(rid, params=params, metrics={**result.metrics, "engine_time_s": result.engine_time_s},
                        series=result.series, timestamp_ms=int((result.ended_at or time.time()) * 1000))
        for name, text in result.artifacts.items():
            self.client.log_text(rid, text, name)
        self.client.set_terminated(rid, status=result.state.value,
                                   end_time=int((result.ended_at or time.time()) * 1000))
        return rid

    def _log_batch(self, run_id: str, *, params: Mapping[str, str] | None = None,
                   metrics: Mapping[str, float] | None = None, series: Mapping[str, list[float]] | None = None,
                   timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric, Param

        ts = timestamp_ms or int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, 0) for k, v in (metrics or {}).items()]
        for key, values in (series or {}).items():
            ms += [Metric(key, float(v), ts, i) for i, v in enumerate(values)]
        ps = [Param(k[:250], str(v)[:MAX_PARAM_VALUE]) for k, v in (params or {}).items()]
        for chunk in _chunks(ps, BATCH_PARAMS):
            self.client.log_batch(run_id, params=chunk)
        for chunk in _chunks(ms, BATCH_METRICS):
            self.client.log_batch(run_id, metrics=chunk)


def _hydra_multirun_yaml() -> str | None:
    """The `multirun.yaml` Hydra wrote in this sweep's directory, when running under a Hydra multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        path = Path(HydraConfig.get().sweep.dir) / "multirun.yaml"
        return path.read_text() if path.is_file() else None
    except Exception:  # not under Hydra, or no sweep dir: the parent simply has no multirun.yaml
        return None


def schedule_tags(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A sweep fired by `orchestrator.schedule` carries its schedule name and scheduled time."""
    from orchestrator.schedule import ENV_SCHEDULE, ENV_SCHEDULED_TIME

    if ENV_SCHEDULE not in environ:
        return {}
    return {"schedule": environ[ENV_SCHEDULE], "scheduled_time": environ.get(ENV_SCHEDULED_TIME, "")}


def finished_run_hashes(settings: ExecutionSettings, plan: Plan | None = None) -> set[str]:
    """run_hashes already FINISHED in the sweep's experiment (empty when the store or experiment is new)."""
    return Tracker.from_settings(settings, plan).finished_run_hashes()
