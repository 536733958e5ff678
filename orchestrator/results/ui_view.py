"""How a sweep's experiment opens in the MLflow UI (3.x): the runs view, the sweep's axes and the answering columns.

    prepare_experiment(client, experiment_id)                 the training/runs view, not GenAI mode
    publish_view(client, experiment_id, axes) -> str           a saved view; returns its share key
    view_url(base_url, experiment_id) -> str                  the experiment's link with that view
    axis_tags(overrides) -> {"axis.context_len": "1024", ...} a child run's position on the grid (tags)
    axis_params(overrides) -> {"axis.context_len": "1024", ...} the same as params: they sort before `cfg.*`
    (the tags themselves: orchestrator.results.store_layout; CHILD_UI_TAGS on every child opens its parent expanded)

What MLflow 3.17 reads (its UI bundle, mlflow/server/js/build/static/js/ in the installed wheel):
- The experiment-kind tag `mlflow.experimentKind` picks the experiment page's mode. Its values are the enum in
  main.c2f5f8d4.js (`GENAI_DEVELOPMENT="genai_development", CUSTOM_MODEL_DEVELOPMENT="custom_model_development",
  ...`); the UI itself writes it with setExperimentTag (2809.4115baa4.chunk.js), and MLflow's own demo sets
  `genai_development` the same way (mlflow/demo/generators/traces.py:328-330). `custom_model_development` is the
  training/runs view.
- A saved view is an experiment tag `mlflow.sharedViewState.<key>` whose value is the JSON of the page state, opened
  by `#/experiments/<id>?viewStateShareKey=<key>` (main.c2f5f8d4.js: `U="viewStateShareKey"`,
  `$="mlflow.sharedViewState."`; 3878.0467b2c4.chunk.js parses a plain JSON value). Of the state it keeps
  `selectedColumns` and `searchFilter` among others, but never `runsExpanded` (dropped when a shared view loads).
  Column ids are `<type>.`<key>``, type one of attributes / params / metrics / tags.
- Child runs nest under their parent (tag `mlflow.parentRunId`) when the table is sorted by start time, the
  default (3878.0467b2c4.chunk.js: `q=!O&&!P||O===d.T8.DATE`, nestChildren), and a parent opens collapsed. On the
  first visit of an experiment (no UI state stored in the browser yet) the UI expands the parent of every run tagged
  `mlflow.runType=evaluation` (3878.0467b2c4.chunk.js `Ra`, with main.c2f5f8d4.js `_="mlflow.runType"`,
  `M="evaluation"`). So each child carries that tag (`CHILD_UI_TAGS`) and the experiment's page opens with the
  sweep's points under their parent; a parent the user collapsed stays collapsed (the browser keeps that state).
- The saved view sorts by run name instead, so it lists the points themselves as rows (no nesting, nothing to
  expand, whatever the browser stored), ordered by their name (`ctx=... probe=... drafter=...`).
Both are checked in Chromium, from the DOM, by tests/orchestrator/test_e2e_smoke.py.
MLflow cannot set an experiment's default columns; the saved view is the documented link instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from orchestrator.results.metric_catalogue import UI_METRICS
from orchestrator.results.store_layout import (AXES_TAG, AXIS_PREFIX, EXPERIMENT_KIND_TAG, ROLE_CHILD, ROLE_TAG,
                                               RUNS_VIEW_KIND, VIEW_KEY, VIEW_TAG_PREFIX)

# The columns that answer the question (the catalogue's UI view, in its order); verify ms and roofline fraction only
# show values where a run measured them (MLflow leaves the cell empty otherwise).
ANSWER_METRICS = UI_METRICS


def axis_key(override: str) -> str:
    """`hydra.sweeper` override `+drafter=ngram` -> `drafter`."""
    return override.split("=", 1)[0].lstrip("+~")


def axis_tags(overrides: Iterable[str]) -> dict[str, str]:
    """The tags of one grid point: `axis.<key>` = value per override, and `sweep.axes` (the keys)."""
    tags = {f"{AXIS_PREFIX}{axis_key(o)}": o.split("=", 1)[1] for o in overrides if "=" in o}
    if tags:
        tags[AXES_TAG] = " ".join(k[len(AXIS_PREFIX):] for k in tags)
    return tags


def axis_params(overrides: Iterable[str]) -> dict[str, str]:
    """`axis.<key>` params of one grid point (the tags less `sweep.axes`): first in the run page's params table."""
    return {k: v for k, v in axis_tags(overrides).items() if k != AXES_TAG}


def view_state(axes: Sequence[str]) -> dict:
    """The saved view: the points (child runs, a row each, by name) with the axes and the answering metrics as
    columns."""
    columns = ["attributes.`Run Name`"] + [f"tags.`{AXIS_PREFIX}{a}`" for a in axes]
    columns += [f"metrics.`{m}`" for m in ANSWER_METRICS]
    return {"selectedColumns": columns, "searchFilter": f"tags.`{ROLE_TAG}` = '{ROLE_CHILD}'",
            "orderByKey": "tags.`mlflow.runName`", "orderByAsc": True}


def prepare_experiment(client, experiment_id: str) -> None:
    client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, RUNS_VIEW_KIND)


def publish_view(client, experiment_id: str, axes: Sequence[str]) -> str:
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + VIEW_KEY, json.dumps(view_state(axes)))
    return VIEW_KEY


def view_url(base_url: str, experiment_id: str, key: str = VIEW_KEY) -> str:
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}"
