"""A sweep's runs read back from MLflow: the parent run of a sweep name or run id, and its points as `ChildRun`s.

It covers every point of the sweep: the parent's own child runs, and for each point skipped on resume (the
parent's `run_hashes.txt`) the latest FINISHED child run of the experiment with that run_hash, from an earlier
invocation (column `invocation`). Params are decoded through the config schema (`orchestrator.config.params`).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.params import RunParams, config_params
from orchestrator.config.weights_scope import dummy_weights_reason
from orchestrator.results.diagnosis import RunRow
from specsweep_common.greedy_output import OUTPUT_IDS_ARTIFACT, GreedyOutput
from specsweep_common.sglang_facts import SGLANG_PLUGIN_BACKENDS
from specsweep_common.spec import Algorithm, EngineKind
from orchestrator.results.store_layout import (ENGINE_TAG, FAILURE_REASON_TAG, JOB_TAG, LOSSLESS_KEY_TAG, PARENT_TAG,
                                               RUN_HASH_TAG, RUN_HASHES_ARTIFACT)

if TYPE_CHECKING:
    from mlflow.entities import Run

log = logging.getLogger(__name__)


class ReportError(RuntimeError):
    pass


@dataclass(frozen=True)
class ChildRun:
    row: RunRow
    status: str
    reason: str
    job: str = "engine"  # engine | kernel (the child's `job` tag)
    earlier_parent: str = ""  # the parent run of an earlier invocation that recorded it ("" = this one)

    @property
    def invocation(self) -> str:
        return f"earlier ({self.earlier_parent[:8]})" if self.earlier_parent else "this"


def row_from_run(run) -> RunRow:
    p = RunParams.read(run.data.params)
    engine = run.data.tags.get(ENGINE_TAG, "")
    return RunRow(
        run_id=run.info.run_id, name=run.info.run_name or run.info.run_id, context_len=p.context_len,
        probe=p.probe, drafter=p.drafter, attention=p.attention, page_size=p.page_size, is_oracle=p.is_oracle,
        num_steps=p.num_steps, metrics=dict(run.data.metrics), engine=engine, concurrency=p.concurrency,
        dummy_weights=dummy_weights_reason(config_params(run.data.params)),
        plugin=bool((kind := EngineKind.named(engine)) and kind.loads_kernel_plugin
                    and any(b in SGLANG_PLUGIN_BACKENDS for b in p.backends)),
        speculative=p.algorithm != Algorithm.NONE.value, dtype=p.dtype,
        lossless_key=run.data.tags.get(LOSSLESS_KEY_TAG, ""),
    )


def with_outputs(client, rows: list[RunRow]) -> list[RunRow]:
    """`rows` with their greedy outputs (`output_ids.json`) read back, for the lossless check: those at temperature 0
    whose `lossless_key` both a speculative run and a run without speculation share (the others are never compared:
    no download). A run without the artifact (recorded before it existed) keeps output None, and the check names it;
    a malformed one is logged and kept None the same way."""
    from mlflow.exceptions import MlflowException

    greedy = [r for r in rows if r.lossless_key and r.temperature <= 0]
    paired = {r.lossless_key for r in greedy if r.speculative} & {r.lossless_key for r in greedy if not r.speculative}
    out = []
    with tempfile.TemporaryDirectory(prefix="specsweep-outputs-") as tmp:
        for r in rows:
            if r.lossless_key in paired and r.temperature <= 0:
                try:
                    path = client.download_artifacts(r.run_id, OUTPUT_IDS_ARTIFACT, f"{tmp}/{r.run_id}")
                    r = replace(r, output=GreedyOutput.from_json(Path(path).read_text()))
                except (MlflowException, OSError):
                    pass  # not recorded: the lossless check says so
                except ValueError as e:
                    log.warning("run %s: %s unreadable, left out of the lossless check: %s", r.run_id[:8],
                                OUTPUT_IDS_ARTIFACT, e)
            out.append(r)
    return out


def resolve_parent(client, target: str) -> tuple[str, str]:
    """(parent run id, experiment name) for a parent run id or a sweep (experiment) name."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(target)
        exp = client.get_experiment(run.info.experiment_id)
        return run.info.run_id, exp.name
    except MlflowException:
        pass
    exp = client.get_experiment_by_name(target)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ReportError(f"{target!r} is neither a run id nor a sweep name; sweeps here: {', '.join(names) or 'none'}")
    parents = [r for r in client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"],
                                             max_results=200) if PARENT_TAG not in r.data.tags]
    if not parents:
        raise ReportError(f"sweep {target!r} has no parent run yet")
    return parents[0].info.run_id, exp.name


def _child(run, earlier_parent: str = "") -> ChildRun:
    return ChildRun(row_from_run(run), run.info.status, run.data.tags.get(FAILURE_REASON_TAG, ""),
                    run.data.tags.get(JOB_TAG, "engine"), earlier_parent)


def sweep_run_hashes(client, parent_run_id: str) -> list[str] | None:
    """Every point of the parent's sweep (its `run_hashes.txt`); None for a parent recorded without one."""
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory(prefix="specsweep-hashes-") as tmp:
        try:
            path = client.download_artifacts(parent_run_id, RUN_HASHES_ARTIFACT, tmp)
        except (MlflowException, OSError):
            return None
        return Path(path).read_text().split()


def _finished_children(client, experiment_id: str):
    from mlflow.entities import ViewType

    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string="attributes.status = 'FINISHED'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        yield from (r for r in page if PARENT_TAG in r.data.tags and RUN_HASH_TAG in r.data.tags)
        token = page.token
        if not token:
            return


def load_children(client, parent_run_id: str, run_hashes: Collection[str] | None = None) -> list[ChildRun]:
    """The parent's child runs, plus, for each of `run_hashes` without a FINISHED one among them, the latest FINISHED
    child run of the experiment with that run_hash (recorded by an earlier invocation of the sweep)."""
    parent = client.get_run(parent_run_id)
    exp_id = parent.info.experiment_id
    runs = client.search_runs([exp_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'", max_results=50000)
    children = [_child(r) for r in runs]
    missing = set(run_hashes or ()) - {r.data.tags.get(RUN_HASH_TAG) for r in runs if r.info.status == "FINISHED"}
    if missing:
        latest: dict[str, Run] = {}
        for r in _finished_children(client, exp_id):
            h = r.data.tags[RUN_HASH_TAG]
            if h in missing and (h not in latest or r.info.start_time > latest[h].info.start_time):
                latest[h] = r
        children += [_child(r, r.data.tags[PARENT_TAG]) for r in latest.values()]
    children.sort(key=lambda c: (c.row.context_len, c.row.probe, c.row.drafter, c.row.attention, c.row.page_size,
                                 c.earlier_parent))
    return children
