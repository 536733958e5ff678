"""MLflow: one experiment per sweep, a parent run per sweep invocation, a child run per RunSpec.

Public API:

    tracker = Tracker(uri: str = "sqlite:///mlflow.db", experiment: str = "specsweep")
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

    with tracker.store_lock():                       the store's file lock (SQLite stores), reentrant in a process
        tracker.reap_lost_drivers() -> int           RUNNING runs of gone drivers -> FAILED `driver_lost`
        tracker.live_claims() -> dict[str, str]      run_hash -> who holds it (RUNNING children of live drivers)
        tracker.claim(runs) -> dict[int, str]        a RUNNING child per RunSpec (job_index -> run id)
    tracker.release_claims(state, reason, message)  claims that got no result: closed, never left RUNNING

Experiments. One per sweep: `tracking.experiment_name`, else `sweep_name`. A sweep on the stub engine
(`engine=stub`: simulated commits and timings) records into `<that name>-stub` instead, so its runs never mix with
real results or resume against them; a sweep mixing the stub with a real engine is rejected (`experiment_for`).

Concurrent drivers (docs/orchestrator.md, "Concurrent sweeps and lost drivers"). A SQLite store is created and
migrated under an exclusive `flock` on `<db>.lock` beside the database (`orchestrator.results.store_lock`). The
launcher claims its points under the same lock: each RunSpec it will run gets a RUNNING child run at submission,
tagged with the driver's identity (`orchestrator.results.drivers`); another driver skips every run_hash with such a
claim while that driver lives, and marks claims (and parents) of drivers that are gone FAILED `driver_lost`, then
runs those points itself. The parent carries `driver_heartbeat` (unix seconds, every `HEARTBEAT_S`).

Secrets: this is the store's one boundary. The plan holds the real values; every name, param (by its key), tag and
artifact written here goes through `specsweep_common.redact` (structure, and the literal secrets of the plan given
to `from_settings`, or given as `secrets`, or found in the tracking URI). The other modules that write to MLflow
write only what they read back from it, or constants (tests/orchestrator/test_secrets.py lists them).

Layout. Parent: params = resolved base config flattened under `cfg.` (`cfg.a.b.c`: orchestrator/config/params.py
`recorded`, read back by `config_params`), `overrides`; tags = `specsweep.role=parent`,
git sha, host, sweep, the schedule that fired it (`orchestrator.results.provenance`); metrics `runs_planned` (this
invocation), `runs_resumed` (skipped: FINISHED earlier); artifacts = `config.yaml`, `overrides.txt`,
`run_hashes.txt` (every point of the sweep, one run_hash a line, resumed ones included: what the report covers),
`multirun.yaml` (given, or found in Hydra's sweep dir); `sweep.axes` = the keys the sweep varies. Experiment tags:
the runs view and a saved view of the axes and answering columns (`orchestrator.results.ui_view`). Child:
`mlflow.parentRunId`, run name = RunSpec.name, params = `axis.<key>` per swept key, then RunSpec.params under `cfg.`,
and `overrides`; tags = `mlflow.runType` (the UI opens the parent expanded: orchestrator.results.ui_view),
run_hash, point_key (the
point's identity across engine versions and nodes: specsweep_common.point_key), lossless_key (point_key without the
drafter: what the diagnosis' lossless check pairs a speculative run with its drafter=none run by), job_index,
server_group, engine, engine_version, host, git sha, attempt, engine_start, failure_reason, `axis.<key>` per
swept key (and `sweep.axes`); metrics in
`log_batch` calls, the `commit_len` series (and any `metrics.log_patterns` series) with step = index; artifacts =
RunResult.artifacts (continuation text, per-step CSV, engine log tail on failure).

With a `sqlite:` store, artifacts go to `mlartifacts/` next to the database file (never `./mlruns`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from orchestrator.config.params import CONFIG_PREFIX, recorded
from orchestrator.config.param_encoding import to_params
from orchestrator.config.settings import ExecutionSettings
from orchestrator.results import fault_notes
from orchestrator.results.drivers import HEARTBEAT_S, DriverId
from orchestrator.results.ui_view import (axis_key, axis_params, axis_tags,
                                           prepare_experiment, publish_view)
from orchestrator.results.provenance import git_sha, hydra_multirun_yaml, redact_multirun_yaml, schedule_tags
from orchestrator.results.store_layout import (AXES_TAG, CHILD_UI_TAGS, PARENT_TAG, ROLE_CHILD, ROLE_PARENT, ROLE_TAG,
                                               RUN_HASH_TAG, RUN_HASHES_ARTIFACT, STUB_EXPERIMENT_SUFFIX,
                                               POINT_KEY_TAG, LOSSLESS_KEY_TAG, FAILURE_REASON_TAG)
from orchestrator.results.store_lock import StoreLock
from specsweep_common.point_key import lossless_key, point_key
from specsweep_common.redact import plan_secrets, redact_config, redact_override, redact_param, redact_text, uri_secrets
from specsweep_common.spec import FailureReason, RunResult, RunSpec, RunState, engine_mix_allowed

if TYPE_CHECKING:
    from orchestrator.config.plan import Plan

logger = logging.getLogger(__name__)

MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value
BATCH_METRICS, BATCH_PARAMS, BATCH_TAGS = 1000, 100, 100  # MLflow's log_batch limits
DRIVER_LOST = "driver_lost"  # failure_reason of a RUNNING run whose driver is gone
DEFAULT_EXPERIMENT = "specsweep"  # RunConfig.sweep_name's default (never MLflow's own `Default`)


def sweep_axes(plan) -> tuple[str, ...]:
    """The keys a sweep varies: override keys whose value differs between its points (in first-seen order)."""
    values: dict[str, set[str]] = {}
    for run in (*plan.runs, *(r for r, _ in plan.dropped if r is not None)):
        for o in run.overrides:
            if "=" in o:
                values.setdefault(axis_key(o), set()).add(o.split("=", 1)[1])
    return tuple(k for k, v in values.items() if len(v) > 1)


def experiment_for(settings: ExecutionSettings, plan: Plan | None = None) -> str:
    """The MLflow experiment of `plan`'s sweep: `settings.experiment_name`, plus `-stub` when every run is on the
    stub engine. Raises ValueError for a plan mixing the stub with a real engine."""
    kinds = plan.engine_kinds if plan is not None else frozenset()
    if allowed := engine_mix_allowed(kinds):
        raise ValueError(f"engine.kind={sorted(k.value for k in kinds)}: allowed {allowed}")
    return settings.experiment_name + (STUB_EXPERIMENT_SUFFIX if kinds and all(k.simulated for k in kinds) else "")


def _client(uri: str):
    from mlflow import MlflowClient  # ~3 s import: only when tracking is used

    if uri_secrets(uri):  # MLflow prints "View run <uri>/#/..." on stdout per run: with the password in it
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    return MlflowClient(tracking_uri=uri)


def artifact_root_for(uri: str) -> str | None:
    """`mlartifacts/` beside a SQLite file; None (the server's choice) otherwise."""
    if uri.startswith("sqlite:///"):
        return str(Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts")
    return None


def _chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


class Tracker:
    def __init__(self, uri: str = "sqlite:///mlflow.db", experiment: str = DEFAULT_EXPERIMENT, secrets: Iterable[str] = ()):
        self.uri = uri
        self.experiment = experiment
        self.secrets: set[str] = set(secrets) | set(uri_secrets(uri))
        self.lock = StoreLock.for_uri(uri)
        self.driver = DriverId.current()
        self.host = self.driver.host
        with self.store_lock():  # creating (migrating) a new SQLite store: one driver at a time
            self.client = _client(uri)
            self.experiment_id = self._experiment_id()
            prepare_experiment(self.client, self.experiment_id)  # the runs view, not GenAI mode
        self.axes: tuple[str, ...] = ()
        self.parent_run_id: str | None = None
        self.git_sha = "unknown"
        self._parent_ended = False
        self.claims: dict[int, str] = {}  # job_index -> the RUNNING child run claimed for it
        self._heartbeat_stop = threading.Event()

    def store_lock(self):
        """Exclusive across drivers on this store (SQLite: a file lock); a no-op for a tracking server."""
        return self.lock.hold() if self.lock is not None else contextlib.nullcontext()

    def redact(self, text: str) -> str:
        return redact_text(text, self.secrets)

    @classmethod
    def from_settings(cls, settings: ExecutionSettings, plan: Plan | None = None) -> "Tracker":
        """The sweep's experiment (`experiment_for`); `plan`'s secrets are redacted in all it records."""
        return cls(settings.tracking_uri, experiment_for(settings, plan), plan_secrets(plan) if plan else ())

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
        return {r.data.tags[RUN_HASH_TAG] for r in self._search("attributes.status = 'FINISHED'")
                if "run_hash" in r.data.tags}

    def _search(self, filter_string: str) -> list:
        from mlflow.entities import ViewType

        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string=filter_string,
                                           run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                return runs

    # -- concurrent drivers: claims and lost drivers (call under `store_lock()`)

    def reap_lost_drivers(self) -> int:
        """Mark every RUNNING run of this experiment whose driver is gone FAILED `driver_lost` (see
        `DriverId.gone_reason`), or with the reason that driver left in its fault note (`disk_full`:
        orchestrator.results.fault_notes); a child whose parent is no longer RUNNING is an orphan claim and gone too. Runs
        without driver tags (older versions) are left alone. Returns how many were closed."""
        running = self._search("attributes.status = 'RUNNING'")
        heartbeats = {r.info.run_id: float(r.data.tags["driver_heartbeat"]) for r in running
                      if r.data.tags.get("driver_heartbeat", "").replace(".", "", 1).isdigit()}
        running_ids = {r.info.run_id for r in running}
        closed, lost = 0, set()
        for r in running:
            tags = r.data.tags
            driver = DriverId.from_tags(tags)
            if driver is None or driver == self.driver:
                continue
            parent = tags.get(PARENT_TAG)
            why: str | None
            if parent and parent not in running_ids:
                why = f"driver {driver} ended its parent run {parent} and left this run RUNNING"
            else:
                why = driver.gone_reason(heartbeats.get(parent or r.info.run_id))
            if why is None:
                continue
            reason, why = fault_notes.recorded(self.uri, driver) or (DRIVER_LOST, why)  # e.g. disk_full
            self.client.log_batch(r.info.run_id, tags=_run_tags({"failure_reason": reason, "message": why,
                                                                  "state": RunState.FAILED.value}))
            self.client.set_terminated(r.info.run_id, status=RunState.FAILED.value)
            logger.warning("run %s (%s) FAILED %s: %s", r.info.run_id, r.info.run_name, reason, why)
            closed += 1
            lost.add(driver)
        for driver in lost:
            fault_notes.discard(self.uri, driver)
        return closed

    def live_claims(self) -> dict[str, str]:
        """run_hash -> "driver pid P on H (run R)" for each RUNNING child of another live driver (after
        `reap_lost_drivers`, every RUNNING child with driver tags belongs to one)."""
        out = {}
        for r in self._search(f"attributes.status = 'RUNNING' and tags.{ROLE_TAG} = '{ROLE_CHILD}'"):
            driver = DriverId.from_tags(r.data.tags)
            if driver is not None and driver != self.driver and "run_hash" in r.data.tags:
                out[r.data.tags[RUN_HASH_TAG]] = f"driver {driver} (run {r.info.run_id})"
        return out

    def claim(self, runs: Sequence[RunSpec]) -> dict[int, str]:
        """A RUNNING child run per RunSpec, tagged with this driver: other drivers skip these run_hashes."""
        for spec in runs:  # the fewest tags here (a claim is on the critical path); log_result adds the rest
            tags = {ROLE_TAG: ROLE_CHILD, RUN_HASH_TAG: spec.run_hash, "job_index": str(spec.job_index),
                    **self.driver.tags(), "state": "RUNNING", **CHILD_UI_TAGS}
            if self.parent_run_id:
                tags[PARENT_TAG] = self.parent_run_id
            run = self.client.create_run(self.experiment_id, run_name=self.redact(spec.name), tags=_redacted(
                tags, self))
            self.claims[spec.job_index] = run.info.run_id
        return dict(self.claims)

    def release_claims(self, state: RunState = RunState.KILLED, reason: FailureReason = FailureReason.INTERRUPTED,
                       message: str = "the sweep ended before this run had a result") -> int:
        """Close every claim that got no result (it would otherwise stay RUNNING)."""
        n = 0
        for job_index, rid in list(self.claims.items()):
            with contextlib.suppress(Exception):  # one failed close must not leave the others RUNNING
                self.client.log_batch(rid, tags=_run_tags({"failure_reason": reason.value, "message": message,
                                                           "state": state.value}))
                self.client.set_terminated(rid, status=state.value)
                n += 1
            del self.claims[job_index]
        return n

    # -- parent

    @contextlib.contextmanager
    def start_parent(self, plan, *, work_dir: str | os.PathLike = ".", multirun_yaml: str | None = None,
                     tags: Mapping[str, str] | None = None) -> Iterator[str]:
        """`plan` is an `orchestrator.config.plan.Plan` (sweep_name, base_config, overrides, num_runs, run_hashes and
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
            tags=_redacted({ROLE_TAG: ROLE_PARENT, "sweep": plan.sweep_name, "git_sha": self.git_sha, "host": self.host,
                            **self.driver.tags(), "driver_heartbeat": f"{time.time():.0f}", **schedule_tags(),
                            **dict(tags or {})}, self))
        self.parent_run_id = run.info.run_id
        self._parent_ended = False
        self.axes = sweep_axes(plan) if hasattr(plan, "runs") else ()
        if self.axes:
            self.client.set_tag(run.info.run_id, AXES_TAG, " ".join(self.axes))
        publish_view(self.client, self.experiment_id, self.axes)
        rid = self.parent_run_id
        base = redact_config(plan.base_config) if plan.base_config else None
        params = recorded(to_params(base or {}))  # the config under `cfg.` (orchestrator/config/params.py)
        params["overrides"] = " ".join(plan.overrides)
        self._log_batch(rid, params=params, metrics={"runs_planned": float(plan.num_runs),
                                                     "runs_resumed": float(len(plan.resumed))})
        if base:
            import yaml

            self.client.log_text(rid, self.redact(yaml.safe_dump(base, sort_keys=False)), "config.yaml")
        self.client.log_text(rid, self.redact("\n".join(plan.overrides) + "\n"), "overrides.txt")
        self.client.log_text(rid, "".join(f"{h}\n" for h in plan.run_hashes), RUN_HASHES_ARTIFACT)
        multirun_yaml = multirun_yaml or hydra_multirun_yaml()
        if multirun_yaml:
            self.client.log_text(rid, redact_multirun_yaml(multirun_yaml, self.secrets), "multirun.yaml")
        self._heartbeat_stop = threading.Event()  # one per parent: a late beat never touches the next parent
        threading.Thread(target=self._heartbeat, args=(rid, self._heartbeat_stop), name="mlflow-heartbeat",
                         daemon=True).start()
        return rid

    def _heartbeat(self, rid: str, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a missed beat only ages the heartbeat
                self.client.set_tag(rid, "driver_heartbeat", f"{time.time():.0f}")

    def log_parent_metrics(self, metrics: Mapping[str, float]) -> None:
        if self.parent_run_id:
            self._log_batch(self.parent_run_id, metrics=metrics)

    def tag_parent(self, key: str, value: str) -> None:
        """One tag on the parent run (redacted, at most 5,000 characters); raises what the store raises."""
        if self.parent_run_id:
            self.client.set_tag(self.parent_run_id, key, self.redact(value)[:5000])

    def end_parent(self, status: RunState | str = RunState.FINISHED) -> None:
        self._heartbeat_stop.set()
        if self.parent_run_id and not self._parent_ended:
            self.client.set_terminated(self.parent_run_id, status=RunState(status).value)
            self._parent_ended = True

    # -- children

    def _child_tags(self, spec: RunSpec) -> dict[str, str]:
        tags = {ROLE_TAG: ROLE_CHILD, RUN_HASH_TAG: spec.run_hash, POINT_KEY_TAG: point_key(spec.server, spec.probe),
                LOSSLESS_KEY_TAG: lossless_key(spec.server, spec.probe), "job_index": str(spec.job_index),
                "server_group": spec.server.key, "engine": spec.server.engine.kind.value,
                "engine_version": spec.server.engine.version, "host": self.host, "git_sha": self.git_sha,
                **CHILD_UI_TAGS}
        if self.parent_run_id:
            tags[PARENT_TAG] = self.parent_run_id
        return tags

    def log_result(self, result: RunResult) -> str:
        """One child run: the RunSpec's claim when it has one (a retried attempt always gets its own run)."""
        spec = result.run
        swept = [redact_override(o) for o in spec.overrides if axis_key(o) in self.axes]
        tags = {**self._child_tags(spec), "state": result.state.value, **result.tags, **axis_tags(swept)}
        if result.reason:
            tags[FAILURE_REASON_TAG] = result.reason.value
        if result.message:
            tags["message"] = result.message[:5000]
        claimed = None if result.tags.get("retried") == "true" else self.claims.pop(spec.job_index, None)
        if claimed is not None:
            rid = claimed
            self._log_batch(rid, tags=_redacted(tags, self))
        else:
            start_ms = int((result.started_at or time.time()) * 1000)
            run = self.client.create_run(self.experiment_id, run_name=self.redact(spec.name), start_time=start_ms,
                                         tags=_redacted(tags, self))
            rid = run.info.run_id
        params = {**axis_params(swept), **recorded(dict(spec.params))}  # the axes, then the config under `cfg.`
        if spec.overrides:
            params.setdefault("overrides", " ".join(spec.overrides))
        self._log_batch(rid, params=params, metrics={**result.metrics, "engine_time_s": result.engine_time_s},
                        series=result.series, timestamp_ms=int((result.ended_at or time.time()) * 1000))
        for name, text in result.artifacts.items():
            self.client.log_text(rid, self.redact(text), name)
        self.client.set_terminated(rid, status=result.state.value,
                                   end_time=int((result.ended_at or time.time()) * 1000))
        return rid

    def _log_batch(self, run_id: str, *, params: Mapping[str, str] | None = None,
                   metrics: Mapping[str, float] | None = None, series: Mapping[str, list[float]] | None = None,
                   tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric, Param

        ts = timestamp_ms or int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, 0) for k, v in (metrics or {}).items()]
        for key, values in (series or {}).items():
            ms += [Metric(key, float(v), ts, i) for i, v in enumerate(values)]
        ps = [Param(k[:250], redact_param(k.removeprefix(CONFIG_PREFIX), str(v), self.secrets)[:MAX_PARAM_VALUE])
              for k, v in (params or {}).items()]
        for chunk in _chunks(_run_tags(tags or {}), BATCH_TAGS):
            self.client.log_batch(run_id, tags=chunk)
        for chunk in _chunks(ps, BATCH_PARAMS):
            self.client.log_batch(run_id, params=chunk)
        for chunk in _chunks(ms, BATCH_METRICS):
            self.client.log_batch(run_id, metrics=chunk)


def _redacted(tags: Mapping[str, str], tracker: Tracker) -> dict[str, str]:
    return {k: tracker.redact(str(v)) for k, v in tags.items()}


def _run_tags(tags: Mapping[str, str]) -> list:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in tags.items()]


def finished_run_hashes(settings: ExecutionSettings, plan: Plan | None = None) -> set[str]:
    """run_hashes already FINISHED in the sweep's experiment (empty when the store or experiment is new)."""
    return Tracker.from_settings(settings, plan).finished_run_hashes()
