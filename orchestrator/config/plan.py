"""Planning: pure functions from typed, validated run configs to a `Plan` of server groups.

Expand (one `RunSpec` per job) → drop points above the model's context → group by `ServerSpec` →
resume filter. No Ray, MLflow, engine or Hydra here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from specsweep_common.redact import redact_override
from specsweep_common.spec import EngineKind, EngineSpec, JobKind, RunSpec, ServerGroup, ServerSpec, stable_hash
from orchestrator.config.context import check_context
from specsweep_common.plan_point import server_context_len
from workers.registry import adapter_for

if TYPE_CHECKING:
    from orchestrator.config.schema import RunConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    sweep_name: str
    groups: tuple[ServerGroup, ...]  # one per distinct ServerSpec, deterministic order
    dropped: tuple[tuple[RunSpec | None, str], ...] = ()  # (point, why) left out at planning
    # resolved config of the first job (the parent run's params) and the sweep's command-line overrides, as given:
    # the Tracker redacts what it records (specsweep_common.redact)
    base_config: dict[str, Any] | None = None
    overrides: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()  # run_hashes of grid points left out because already FINISHED (plan_resume)

    @property
    def runs(self) -> tuple[RunSpec, ...]:
        """Every planned run, in job order."""
        return tuple(sorted((r for g in self.groups for r in g.runs), key=lambda r: r.job_index))

    @property
    def num_runs(self) -> int:
        return sum(len(g.runs) for g in self.groups)

    @property
    def run_hashes(self) -> tuple[str, ...]:
        """Every point of the sweep: the runs to run and those resumed (the report covers them all)."""
        return tuple(dict.fromkeys([*(r.run_hash for r in self.runs), *self.resumed]))

    @property
    def engine_kinds(self) -> frozenset[EngineKind]:
        return frozenset(r.server.engine.kind for r in (*self.runs, *(r for r, _ in self.dropped if r is not None)))


# Override keys the standard name already shows, or that never change a result.
_NAMED_KEYS = {"context_len", "probe", "drafter", "page_size", "attention", "sweep"}
_UNNAMED_PREFIXES = ("hydra", "tracking", "cluster", "resume", "progress", "sweep_name", "metrics", "regress")


def format_tokens(n: int) -> str:
    """1024 → "1k", 189440 → "185k", 1000 → "1000"."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def build_name(rc: RunConfig) -> str:
    """`ctx=16k probe=predictable drafter=ngram page=1 attn=torch`, plus any other overridden key."""
    parts = [f"ctx={format_tokens(rc.probe.context_len)}", f"probe={rc.probe.kind.value}",
             f"drafter={rc.drafter.name}", f"page={rc.page_size}", f"attn={rc.attention.name}"]
    for o in rc.overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key not in _NAMED_KEYS and not key.startswith(_UNNAMED_PREFIXES):
            parts.append(redact_override(o.lstrip("+~")))
    return " ".join(parts)


def server_engine(engine: EngineSpec) -> EngineSpec:
    """The EngineSpec a server is started with (this starts nothing), as its engine's adapter says
    (`EngineAdapter.server_engine`: the stub takes its timing as `--stub-*` flags prepended to `extra_args`)."""
    return adapter_for(engine.kind).server_engine(engine)


def build_server(rc: RunConfig) -> ServerSpec:
    """The engine a run needs. No context_len in it: one server covers every context of a sweep."""
    return ServerSpec(engine=server_engine(rc.engine), model=rc.model, drafter=rc.drafter, attention=rc.attention,
                      page_size=rc.page_size, server_context_len=server_context_len(rc),
                      seed=rc.seed, tp_size=rc.tp_size, nnodes=rc.nnodes)


def build_kernel_server(rc: RunConfig) -> ServerSpec:
    """Kernel jobs: one group per engine/device setting (no engine runs; the group's actor holds the GPU, so
    its shapes run one at a time and never share it)."""
    return ServerSpec(engine=rc.engine, model=rc.model, drafter=rc.drafter, attention=rc.attention, page_size=0,
                      server_context_len=0, seed=0, tp_size=1, nnodes=1, job=JobKind.KERNEL)


def build_run(rc: RunConfig, job_index: int) -> RunSpec:
    """Params and overrides keep the real values (the Tracker redacts what it records); the name is a label other
    processes log, built from redacted overrides (`build_name`)."""
    params, overrides = rc.params, rc.overrides
    if rc.job is JobKind.KERNEL:
        assert rc.kernel is not None
        return RunSpec(job_index=job_index, server=build_kernel_server(rc), probe=rc.probe,
                       run_hash=stable_hash("kernel", rc.kernel), name=rc.kernel.name + f" dtype={rc.kernel.dtype}",
                       params=params, overrides=overrides, kernel=rc.kernel)
    server = build_server(rc)
    if extra := adapter_for(rc.engine.kind).run_params(rc):  # e.g. SGLang's resolved backends (not identity)
        params = tuple(sorted({**dict(params), **extra}.items()))
    return RunSpec(job_index=job_index, server=server, probe=rc.probe, run_hash=stable_hash(server, rc.probe),
                   name=build_name(rc), params=params, overrides=overrides, log_patterns=rc.log_patterns)


def group_runs(runs: Iterable[RunSpec]) -> tuple[ServerGroup, ...]:
    """One group per distinct ServerSpec, ordered by each group's first job; runs in job order."""
    by_server: dict[ServerSpec, list[RunSpec]] = {}
    for run in sorted(runs, key=lambda r: r.job_index):
        by_server.setdefault(run.server, []).append(run)
    return tuple(ServerGroup(server, tuple(rs)) for server, rs in by_server.items())


def _drop_summary(dropped: Sequence[tuple[RunSpec, str]], total: int) -> str:
    per_model: dict[tuple[str, int], set[int]] = {}
    for run, _ in dropped:
        per_model.setdefault((run.server.model.name, run.server.server_context_len), set()).add(run.probe.context_len)
    what = "; ".join(f"model {name} server context {mx}: context_len "
                     + ", ".join(str(c) for c in sorted(ctxs)) for (name, mx), ctxs in per_model.items())
    return (f"dropped {len(dropped)} of {total} grid points whose context_len + gen_tokens (+ SGLang's EAGLE "
            f"reserve) exceeds the server's context length ({what})")


def plan_sweep(sweep_name: str, configs: Sequence[RunConfig], *, drop_over_max: bool = True,
               base_config: dict[str, Any] | None = None, overrides: Sequence[str] = (),
               first_job_index: int = 0) -> Plan:
    """Configs must be validated. `drop_over_max`: leave out points above the model's context (a sweep)
    with one log line; a single run validates that instead."""
    runs: list[RunSpec] = []
    over: list[tuple[RunSpec, str]] = []
    duplicate: list[tuple[RunSpec, str]] = []
    rehearsed: list[str] = []  # context_note of each planned point that has one
    first: dict[str, RunSpec] = {}  # run_hash -> the job that runs it
    for i, rc in enumerate(configs):
        run = build_run(rc, first_job_index + i)
        problem = check_context(rc) if drop_over_max and rc.job is JobKind.ENGINE else None
        if problem:
            over.append((run, f"{problem.key}={problem.value}: needs {problem.allowed}"))
        elif run.run_hash in first:  # the same point twice (an axis listing a value twice): measured once
            duplicate.append((run, f"the same point as job {first[run.run_hash].job_index}: planned once"))
        else:
            first[run.run_hash] = run
            runs.append(run)
            if rc.job is JobKind.ENGINE and (note := adapter_for(rc.engine.kind).context_note(rc)):
                rehearsed.append(note)
    if over:
        log.info(_drop_summary(over, len(configs)))
    if rehearsed:  # the reference engine rehearses SGLang: a point it serves that SGLang would refuse is said
        log.warning("%d grid point(s) are served on their engine but would be refused on engine=sglang, which it "
                    "rehearses (%s)", len(rehearsed), "; ".join(sorted(set(rehearsed))))
    if duplicate:
        log.warning("%d duplicate grid point(s) planned once (jobs %s repeat earlier jobs' run_hash)",
                    len(duplicate), ", ".join(str(r.job_index) for r, _ in duplicate[:10]))
    dropped = over + duplicate
    return Plan(sweep_name=sweep_name, groups=group_runs(runs), dropped=tuple(dropped), base_config=base_config,
                overrides=tuple(overrides))


def plan_resume(plan: Plan, finished_hashes: Iterable[str]) -> tuple[Plan, int]:
    """Leave out runs whose run_hash is already FINISHED (kept in `Plan.resumed`); groups left empty disappear."""
    finished = set(finished_hashes)
    groups, resumed = [], list(plan.resumed)
    for g in plan.groups:
        keep = tuple(r for r in g.runs if r.run_hash not in finished)
        resumed += [r.run_hash for r in g.runs if r.run_hash in finished]
        if keep:
            groups.append(replace(g, runs=keep))
    skipped = len(resumed) - len(plan.resumed)
    return replace(plan, groups=tuple(groups), resumed=tuple(resumed)), skipped
