"""The Optuna study behind a tune: persisted in an RDB (SQLite beside the MLflow store by default), so the same
command resumes it after Ctrl-C or a lost driver.

    storage_url(settings, tracking_uri, work_dir) -> str
    open_study(settings, name, n_objectives, storage) -> optuna.Study   created, or loaded and its interrupted
                                                                        trials queued again
    suggest(trial, space, speculates) -> params       define-by-run: the conditioned space (space.py's conditions)
    measured_trials(study) -> [FrozenTrial]            trials that measured a configuration (the budget's unit)

One trial = one configuration, measured at every workload point (one objective per point, all maximised: output
tok/s). A latency limit is an Optuna constraint (`Trial.set_constraint`, > 0 violates; also the user attr
`constraint`), so the sampler learns where the feasible region is instead of reading a fake 0 tok/s.
"""

from __future__ import annotations

import logging
import random
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from orchestrator.tune.settings import SamplerKind, TuneSettings
from orchestrator.tune.space import DRAFTER, NUM_DRAFT_TOKENS, NUM_STEPS, TOPK

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

STORAGE_FILE = "optuna.db"
CONSTRAINT_ATTR = "constraint"
MEASURED_ATTR = "measured"  # True: this trial ran its configuration; False: answered from an earlier trial
CANDIDATE_ATTR = "candidate"
_SQLITE = "sqlite:///"


def storage_url(settings: TuneSettings, tracking_uri: str, work_dir: str) -> str:
    if settings.storage:
        return settings.storage
    if tracking_uri.startswith(_SQLITE):
        return _SQLITE + str(Path(tracking_uri[len(_SQLITE):]).resolve().parent / STORAGE_FILE)
    return _SQLITE + str(Path(work_dir).resolve() / STORAGE_FILE)


def _sampler(settings: TuneSettings, n_candidates: int) -> "optuna.samplers.BaseSampler":
    import optuna

    if settings.sampler_kind in (SamplerKind.TPE, SamplerKind.MOTPE):
        with warnings.catch_warnings():  # multivariate/group/constant_liar are marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # the first quarter of the budget (at least 3) is random: TPE needs good and bad trials to split
            startup = max(3, min(settings.trials, n_candidates) // 4)
            return optuna.samplers.TPESampler(seed=settings.seed, multivariate=True, group=True, constant_liar=True,
                                              n_startup_trials=startup)
    return optuna.samplers.RandomSampler(seed=settings.seed)


def open_study(settings: TuneSettings, name: str, n_objectives: int, storage: str | None, n_candidates: int,
               grid: Sequence[Mapping[str, Any]] = ()) -> "optuna.Study":
    """Create or load the study; trials a stopped driver left RUNNING are failed and their params queued again.
    `grid` (sampler=grid): every candidate's params, queued in order on a new study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, sampler=_sampler(settings, n_candidates),
                                directions=["maximize"] * n_objectives, load_if_exists=True)
    stale = [t for t in study.get_trials(deepcopy=False) if t.state is optuna.trial.TrialState.RUNNING]
    for t in stale:
        study.enqueue_trial(dict(t.params), skip_if_exists=False)
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    if stale:
        log.info("resume: %d trial(s) of study %r were interrupted; their configurations are asked again "
                 "(runs already FINISHED in MLflow are read back, not run again)", len(stale), name)
    if grid and not study.get_trials(deepcopy=False):
        # in a seeded random order: a grid takes long enough for the machine's load to drift, and measured in the
        # space's own order that drift would line up with one knob (every page_size=64 configuration last)
        order = list(grid)
        random.Random(settings.seed).shuffle(order)
        for params in order:
            study.enqueue_trial(dict(params))
    return study


def suggest(trial: "optuna.trial.Trial", space: Mapping[str, Sequence[Any]],
            speculates: Callable[[Mapping[str, Any]], bool]) -> dict[str, Any]:
    """The conditioned space, define-by-run: the server's knobs and the drafter first, then the drafter's knobs
    only where it speculates, num_draft_tokens only where topk > 1. Every knob is a categorical, numbers too: as
    Optuna integers (their sorted values' positions, so that TPE's kernel would carry a good num_steps=4 over to 3
    and 6) the benchmark's search did worse (docs/tune.md, "Benchmark")."""
    params: dict[str, Any] = {}
    for key in space:
        if not key.startswith(DRAFTER + "."):
            params[key] = trial.suggest_categorical(key, list(space[key]))
    if not speculates(params):
        return params
    for key in space:
        if key.startswith(DRAFTER + ".") and key != NUM_DRAFT_TOKENS:
            params[key] = trial.suggest_categorical(key, list(space[key]))
    if NUM_DRAFT_TOKENS in space and int(params.get(TOPK, 1)) > 1:
        params[NUM_DRAFT_TOKENS] = trial.suggest_categorical(NUM_DRAFT_TOKENS, list(space[NUM_DRAFT_TOKENS]))
    elif NUM_DRAFT_TOKENS in space and NUM_STEPS not in params:
        params[NUM_DRAFT_TOKENS] = trial.suggest_categorical(NUM_DRAFT_TOKENS, list(space[NUM_DRAFT_TOKENS]))
    return params


def measured_trials(study: "optuna.Study") -> list["optuna.trial.FrozenTrial"]:
    import optuna

    return [t for t in study.get_trials(deepcopy=False)
            if t.state is optuna.trial.TrialState.COMPLETE and t.user_attrs.get(MEASURED_ATTR)]
