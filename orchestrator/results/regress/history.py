"""A sweep's history in MLflow: its FINISHED parent runs in time order, their FINISHED child runs by `point_key`, and
the baseline a parent is compared with (`regress.baseline`, `regress.history`).

    load_history(client, experiment_id) -> History          every FINISHED parent and its FINISHED children
    select_baseline(client, history, current, settings) -> Baseline
    settings_of(parent_run) -> RegressSettings              as the sweep was configured (its params `regress.*`)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from orchestrator.config.params import config_params
from orchestrator.config.settings import RegressSettings
from orchestrator.results.store_layout import PARENT_TAG, POINT_KEY_TAG, ROLE_CHILD, ROLE_PARENT, ROLE_TAG

log = logging.getLogger(__name__)



class BaselineError(ValueError):
    """`regress.baseline` names no usable parent run; the message names the value and what is allowed."""


@dataclass(frozen=True)
class PointRun:
    """One FINISHED child run: one measurement of a grid point."""

    run_id: str
    parent_id: str
    point_key: str
    name: str
    metrics: dict[str, float]
    tags: dict[str, str]
    params: dict[str, str]  # schema keys (`config_params`: the same for runs recorded with or without `cfg.`)

    def values(self, metric: str) -> list[float]:
        """This run's values of `metric`: its repeats (`probe.repeats`, the `<metric>.repeats` JSON tag) or the
        single value."""
        raw = self.tags.get(f"{metric}.repeats")
        if raw:
            try:
                return [float(v) for v in json.loads(raw)]
            except (ValueError, TypeError):
                log.warning("run %s: tag %s.repeats is not a JSON list of numbers: %r", self.run_id, metric, raw)
        return [self.metrics[metric]] if metric in self.metrics else []


@dataclass(frozen=True)
class ParentRun:
    run_id: str
    start_time: int  # ms
    status: str
    tags: dict[str, str]
    children: tuple[PointRun, ...] = field(default=())

    @property
    def label(self) -> str:
        import time

        return f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(self.start_time / 1000))} ({self.run_id[:8]})"


@dataclass(frozen=True)
class History:
    parents: tuple[ParentRun, ...]  # FINISHED parents (and the current one when asked for), oldest first

    def by_id(self, run_id: str) -> ParentRun | None:
        return next((p for p in self.parents if p.run_id == run_id), None)


@dataclass(frozen=True)
class Baseline:
    label: str  # "the last 5 FINISHED runs of this sweep (from ... to ...)" / "parent abc (git_sha:3f2c)"
    parents: tuple[ParentRun, ...]  # oldest first

    def runs_of(self, point_key: str) -> list[PointRun]:
        return [c for p in self.parents for c in p.children if c.point_key == point_key]


def _search(client, experiment_id: str, filter_string: str) -> list:
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def _point_run(r) -> PointRun:
    return PointRun(r.info.run_id, r.data.tags[PARENT_TAG], r.data.tags[POINT_KEY_TAG], r.info.run_name or "",
                    dict(r.data.metrics), dict(r.data.tags), config_params(r.data.params))


def load_history(client, experiment_id: str, *, include: str | None = None) -> History:
    """Every FINISHED parent run of the experiment with its FINISHED children that carry a `point_key`, oldest
    first; `include`: a parent run id kept whatever its status (the sweep being reported, still RUNNING)."""
    parents = [r for r in _search(client, experiment_id, f"tags.`{ROLE_TAG}` = '{ROLE_PARENT}'")
               if r.info.status == "FINISHED" or r.info.run_id == include]
    children: dict[str, list[PointRun]] = {}
    for r in _search(client, experiment_id, f"attributes.status = 'FINISHED' and tags.`{ROLE_TAG}` = '{ROLE_CHILD}'"):
        if "point_key" in r.data.tags and PARENT_TAG in r.data.tags:
            children.setdefault(r.data.tags[PARENT_TAG], []).append(_point_run(r))
    out = [ParentRun(p.info.run_id, p.info.start_time, p.info.status, dict(p.data.tags),
                     tuple(sorted(children.get(p.info.run_id, []), key=lambda c: c.name))) for p in parents]
    return History(tuple(sorted(out, key=lambda p: p.start_time)))


def settings_of(parent_params: dict[str, str]) -> RegressSettings:
    """The sweep's `regress.*` settings from its parent-run params (JSON values, `orchestrator.config.param_encoding.param_value`; with or
    without the `cfg.` prefix); defaults for a parent recorded before they existed."""
    parent_params = config_params(parent_params)
    given: dict[str, Any] = {}
    for f in fields(RegressSettings):
        raw = parent_params.get(f"regress.{f.name}")
        if raw is not None:
            try:
                given[f.name] = json.loads(raw)
            except ValueError:
                given[f.name] = raw
    return RegressSettings(**given)


def select_baseline(client, history: History, current_id: str, settings: RegressSettings) -> Baseline:
    """The parents `current_id` is compared with. Raises BaselineError for a `regress.baseline` that names none."""
    current = history.by_id(current_id)
    start = current.start_time if current else None
    earlier = [p for p in history.parents if p.run_id != current_id and (start is None or p.start_time < start)]
    b = settings.baseline
    if b is None:
        chosen = tuple(earlier[-settings.history:])
        if not chosen:
            return Baseline("no earlier FINISHED run of this sweep", ())
        return Baseline(f"the last {len(chosen)} FINISHED run(s) of this sweep ({chosen[0].label} to "
                        f"{chosen[-1].label})", chosen)
    if (p := history.by_id(b)) is not None and p.run_id != current_id:
        return Baseline(f"parent run {p.label}", (p,))
    key, sep, value = b.partition(":")
    if sep:
        tagged = [p for p in history.parents if p.run_id != current_id and p.tags.get(key) == value]
        if tagged:
            return Baseline(f"parent run {tagged[-1].label}, the latest tagged {key}={value}", (tagged[-1],))
    known = ", ".join(p.run_id for p in history.parents[-5:]) or "none"
    raise BaselineError(f"regress.baseline={b!r}: no FINISHED parent run of this sweep with that id"
                        + (f" or tag {key}={value}" if sep else "")
                        + f"; allowed: a parent run id (latest: {known}) or KEY:VALUE of a parent-run tag")


def point_series(history: History, point_key: str, metric: str) -> list[tuple[ParentRun, list[float]]]:
    """(parent, the point's values of `metric` in that parent) over the history, oldest first."""
    out = []
    for p in history.parents:
        values = [v for c in p.children if c.point_key == point_key for v in c.values(metric)]
        if values:
            out.append((p, values))
    return out


def means(runs: Sequence[PointRun], metric: str) -> list[float]:
    """One value per run: the mean over its repeats."""
    out = []
    for r in runs:
        vs = r.values(metric)
        if vs:
            out.append(sum(vs) / len(vs))
    return out
