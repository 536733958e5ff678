"""Each metric is declared once, in orchestrator/results/metric_catalogue.py: the report's tables, the regression
watch, the MLflow view and the live display read their lists from it, no other module spells one of those lists, and
the two documentation tables of the metrics name exactly the catalogue's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from orchestrator.execution import progress
from orchestrator.results import ui_view
from orchestrator.results import metric_catalogue as mc
from orchestrator.results.regress import verdict
from orchestrator.results.report import compare, tables

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("orchestrator", "workers", "specsweep_common", "hydra_plugins", "tools", "kernels/specsweep_kernels")
CATALOGUE_FILE = ROOT / "orchestrator" / "results" / "metric_catalogue.py"
DERIVED = {"summary": mc.SUMMARY_METRICS, "kernel": mc.KERNEL_METRICS, "ui": mc.UI_METRICS,
           "progress": mc.PROGRESS_METRICS, "headline": mc.HEADLINE_METRICS, "watched": tuple(mc.WATCHED),
           "exact watched": tuple(mc.EXACT_WATCHED), "noisy watched": tuple(mc.NOISY_WATCHED)}
# where a metric's figure comes out of the engine's answer: docs/sglang.md gives each its SGLang source
ENGINE_SOURCES = {mc.Source.META_INFO, mc.Source.ENGINE_METRICS, mc.Source.SERVER_INFO, mc.Source.DERIVED}


def test_each_metric_is_one_row_with_a_meaning():
    names = [m.name for m in mc.CATALOGUE]
    assert len(names) == len(set(names))
    for m in mc.CATALOGUE:
        assert m.better in (-1, 0, 1) and m.nature in (mc.EXACT, mc.NOISY) and m.unit, m
        assert not m.watch or m.better, f"{m.name}: a watched metric needs a better direction"
        assert not (mc.View.KERNEL in m.views and m.views - {mc.View.KERNEL}), f"{m.name}: kernel metrics only"
        assert (m.source is mc.Source.KERNEL) == (mc.View.KERNEL in m.views) or not m.views, m


def test_the_readers_lists_are_the_catalogues():
    assert tables.TABLE_METRICS is mc.SUMMARY_METRICS and tables.KERNEL_METRICS is mc.KERNEL_METRICS
    assert tables.TABLE_COLUMNS[-len(mc.SUMMARY_METRICS):] == mc.SUMMARY_METRICS
    assert verdict.METRICS is mc.WATCHED
    assert verdict.EXACT_METRICS is mc.EXACT_WATCHED and verdict.NOISY_METRICS is mc.NOISY_WATCHED
    assert ui_view.ANSWER_METRICS is mc.UI_METRICS
    assert progress.ENGINE_COLUMNS is mc.PROGRESS_METRICS and progress.KERNEL_COLUMNS is mc.KERNEL_METRICS
    assert compare.COMPARED is mc.HEADLINE_METRICS
    # what the lists hold today, so a changed row shows up here as a changed view
    assert mc.SUMMARY_METRICS == ("prompt_tokens", "completion_tokens", "commit_len_mean", "accept_rate",
                                  "verify_steps", "ttft_s", "decode_tok_s", "throughput_tok_s", "verify_step_ms",
                                  "kv_bw_gbs", "roofline_frac", "gpu_util_mean", "continuation_repeat_frac")
    assert mc.WATCHED == {"commit_len_mean": +1, "accept_rate": +1, "decode_tok_s": +1, "throughput_tok_s": +1,
                          "verify_step_ms": -1}
    assert set(mc.EXACT_WATCHED) == {"commit_len_mean", "accept_rate"}
    assert mc.UI_METRICS == ("commit_len_mean", "decode_tok_s", "verify_step_ms", "roofline_frac")
    assert mc.KERNEL_METRICS == ("time_us", "gbs", "floor_frac", "rel_err")


def test_the_saved_view_shows_the_ui_metrics():
    columns = ui_view.view_state(["drafter"])["selectedColumns"]
    assert [c for c in columns if c.startswith("metrics.")] == [f"metrics.`{m}`" for m in mc.UI_METRICS]


def respellings(path: Path, root: Path = ROOT) -> list[str]:
    """Collection literals (tuple, list, set, dict keys) of two or more metric names that hold the same names as one
    of the catalogue's derived lists: a list that would drift from the catalogue."""
    lists = {frozenset(v): k for k, v in DERIVED.items() if len(v) >= 2}
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        elts = (node.keys if isinstance(node, ast.Dict) else node.elts
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else None)
        if not elts:
            continue
        names = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(names) == len(elts) and frozenset(names) in lists:
            out.append(f"{path.relative_to(root)}:{node.lineno} the {lists[frozenset(names)]} list")
    return out


def test_the_checker_finds_a_respelled_list(tmp_path):
    f = tmp_path / "reader.py"
    f.write_text('A = ("decode_tok_s", "commit_len_mean", "verify_step_ms")\n'
                 'B = {"accept_rate": 1, "commit_len_mean": 1}\nC = ("commit_len_mean", "decode_tok_s", "ttft_s")\n'
                 'D = ("commit_len_mean", x)\n')
    assert [s.split()[0] for s in respellings(f, tmp_path)] == ["reader.py:1", "reader.py:2"]


def test_no_other_module_spells_a_catalogue_list():
    found = [s for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py")) if path != CATALOGUE_FILE
             for s in respellings(path)]
    assert not found, "derive these from orchestrator.results.metric_catalogue:\n" + "\n".join(found)


def _table(doc: Path, header: str) -> list[str]:
    """The first cells of the Markdown table whose header line starts with `header`."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split(" | ")[0].lstrip("| "))
    return rows


def test_docs_orchestrator_lists_every_run_metric():
    cells = _table(ROOT / "docs" / "orchestrator.md", "| metric | meaning |")
    documented = {name for cell in cells if not cell.startswith("series") for name in re.findall(r"`([^`]+)`", cell)}
    assert documented == {m.name for m in mc.CATALOGUE if m.source is not mc.Source.KERNEL}


def test_docs_sglang_gives_every_engine_figure_its_source():
    cells = _table(ROOT / "docs" / "sglang.md", "| metric | SGLang fields")
    documented = {re.findall(r"`([^`]+)`", cell)[0] for cell in cells
                  if not cell.startswith(("series", "histogram")) and "not recorded" not in cell}
    assert documented <= set(mc.BY_NAME), documented - set(mc.BY_NAME)
    assert {m.name for m in mc.CATALOGUE if m.source in ENGINE_SOURCES} <= documented
