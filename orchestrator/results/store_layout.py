"""The MLflow store's layout: every tag, artifact name and prefix a sweep writes and the report, the regression
history and the UI read back, named once (as MLflow's own `mlflow/utils/mlflow_tags.py` names its tags).
tests/orchestrator/results/test_store_layout.py checks no other module spells the distinctive ones.

Experiment: `<sweep_name>`, or `<sweep_name>` + STUB_EXPERIMENT_SUFFIX for a simulated engine's sweep; tagged with
EXPERIMENT_KIND_TAG = RUNS_VIEW_KIND (the runs view) and a saved view, VIEW_TAG_PREFIX + VIEW_KEY
(`orchestrator.results.ui_view`).
Parent run (one per invocation): ROLE_TAG = ROLE_PARENT, AXES_TAG, REGRESSION_TAG (after the regression check);
artifact RUN_HASHES_ARTIFACT (every point of the sweep, one run_hash a line: what the report covers).
Child run (one per grid point): PARENT_TAG (MLflow's nesting tag), ROLE_TAG = ROLE_CHILD, RUN_HASH_TAG,
POINT_KEY_TAG, LOSSLESS_KEY_TAG, ENGINE_TAG, JOB_TAG, FAILURE_REASON_TAG, RUN_TYPE_TAG (CHILD_UI_TAGS), AXIS_PREFIX + key per swept key
and AXES_TAG. The params' `cfg.` prefix is the config's encoding (`orchestrator.config.params.CONFIG_PREFIX`), the
config layer below this one. The full list of what each run carries: `orchestrator.results.tracking`.
"""

from __future__ import annotations

# ---------------------------------------------------------------- MLflow's own tags
PARENT_TAG = "mlflow.parentRunId"  # a child run's parent: MLflow nests runs by it
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # which page an experiment opens on
RUNS_VIEW_KIND = "custom_model_development"  # the training/runs view, not GenAI mode
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # + a share key: a saved view of the runs table
RUN_TYPE_TAG = "mlflow.runType"  # `evaluation` on a child: the UI opens its parent expanded
CHILD_UI_TAGS = {RUN_TYPE_TAG: "evaluation"}

# ---------------------------------------------------------------- ours
ROLE_TAG = "specsweep.role"
ROLE_PARENT, ROLE_CHILD = "parent", "child"
RUN_HASH_TAG = "run_hash"  # a grid point's identity in its sweep (resume, claims, the report)
POINT_KEY_TAG = "point_key"  # a point's identity across engine versions and nodes (regression history)
LOSSLESS_KEY_TAG = "lossless_key"  # point_key without the drafter: pairs a speculative run with its none-run (diagnosis)
ENGINE_TAG = "engine"  # the engine kind's value (`specsweep_common.spec.EngineKind`)
JOB_TAG = "job"  # engine | kernel
FAILURE_REASON_TAG = "failure_reason"
REGRESSION_TAG = "regression"  # on the parent: the metrics that got worse, or `none`
VIEW_KEY = "specsweep"  # the saved view's share key
AXIS_PREFIX = "axis."  # a child's tag (and param) per swept key: axis.context_len=1024, axis.drafter=ngram
AXES_TAG = "sweep.axes"  # the parent's (and each child's) list of swept keys, space separated

RUN_HASHES_ARTIFACT = "run_hashes.txt"
STUB_EXPERIMENT_SUFFIX = "-stub"
