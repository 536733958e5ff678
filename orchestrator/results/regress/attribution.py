"""Why a point moved: what differs between its baseline runs and this one, the pattern of the flagged points across
the grid, and the diagnosis rule that tells the drafter from the pipeline.

    differences(current_tags, baseline_tags) -> list[str]      "engine_version: 0.5.22 → 0.5.23"
    grid_pattern(points, flagged) -> str                       "only on probe=novel, context_len ≥ 65536, drafter=ngram"
    drafter_or_pipeline(metric, flagged, points) -> str | None  the oracle rule (orchestrator/results/diagnosis.py)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.results.metric_catalogue import EXACT_WATCHED

# Child-run tags that may change between runs of one point (tracking.py, workers/runners.py, workers/telemetry.py);
# every `sglang.*` tag (SGLang's resolved server args, workers/sglang.py) too.
ATTRIBUTION_TAGS = ("git_sha", "engine_version", "sglang_version", "gpu_name", "gpu_compute_capability",
                    "gpu_driver", "driver_version", "node_id", "node_ip", "host")
ATTRIBUTION_PREFIXES = ("sglang.",)
NODE_TAGS = ("node_ip", "node_id", "host")  # the first one present names a run's node


def _attributable(key: str) -> bool:
    return key in ATTRIBUTION_TAGS or key.startswith(ATTRIBUTION_PREFIXES)


def differences(current: Mapping[str, str], baseline: Sequence[Mapping[str, str]]) -> list[str]:
    """`key: <baseline values> → <current value>` for each attribution tag whose current value is not the baseline's
    (every baseline run's value listed once, oldest first)."""
    out = []
    keys = sorted({k for k in current if _attributable(k)} | {k for t in baseline for k in t if _attributable(k)})
    for k in keys:
        before = list(dict.fromkeys(t.get(k, "(none)") for t in baseline))
        now = current.get(k, "(none)")
        if before and before != [now]:
            out.append(f"{k}: {', '.join(before)} → {now}")
    return out


@dataclass(frozen=True)
class GridPoint:
    """A point's coordinates in the grid, for patterns across it."""

    key: str  # point_key
    context_len: int
    probe: str
    drafter: str
    attention: str
    page_size: int
    node: str
    is_oracle: bool = False

    def coords(self) -> dict[str, object]:
        return {"probe": self.probe, "drafter": self.drafter, "attention": self.attention,
                "page_size": self.page_size, "node": self.node, "context_len": self.context_len}


def node_of(tags: Mapping[str, str]) -> str:
    return next((tags[k] for k in NODE_TAGS if tags.get(k)), "?")


def _fmt_values(dim: str, values: Collection[object], all_values: Collection[object]) -> str:
    if dim == "context_len":
        lo = min(values)  # type: ignore[type-var]
        if set(values) == {v for v in all_values if v >= lo}:  # type: ignore[operator]
            return f"context_len ≥ {lo}"
        hi = max(values)  # type: ignore[type-var]
        if set(values) == {v for v in all_values if v <= hi}:  # type: ignore[operator]
            return f"context_len ≤ {hi}"
    return f"{dim}={'/'.join(str(v) for v in sorted(values, key=str))}"


def grid_pattern(points: Sequence[GridPoint], flagged: Collection[str]) -> str:
    """One phrase for which points moved: "on every point", "on every point of node X", "only on probe=novel,
    context_len ≥ 65536" when one condition per coordinate selects exactly the flagged points, else their count."""
    hit = [p for p in points if p.key in flagged]
    if not hit:
        return "on no point"
    nodes = {p.node for p in points}
    if len(hit) == len(points):
        return "on every point" + (f" (all on node {next(iter(nodes))})" if len(nodes) == 1 and len(points) > 1
                                   else "")
    conds = []
    for dim in ("node", "probe", "drafter", "attention", "page_size", "context_len"):
        all_values = {p.coords()[dim] for p in points}
        values = {p.coords()[dim] for p in hit}
        if values != all_values:
            conds.append((dim, values, all_values))
    selected = [p for p in points if all(p.coords()[d] in vs for d, vs, _ in conds)]
    if conds and len(selected) == len(hit):
        if len(conds) == 1 and conds[0][0] == "node":
            return f"on every point of node {'/'.join(sorted(map(str, conds[0][1])))}"
        return "only on " + ", ".join(_fmt_values(d, vs, av) for d, vs, av in conds)
    return f"on {len(hit)} of {len(points)} points (no single condition per coordinate selects exactly them)"


def drafter_or_pipeline(metric: str, falling: Collection[str], points: Sequence[GridPoint]) -> str | None:
    """The oracle rule for a commit-length drop (orchestrator/results/diagnosis.py: the oracle must commit
    num_steps + 1): with the oracle's points unchanged the drafter changed, not the pipeline; with them falling too,
    the pipeline (verification, the engine) did. None when it does not apply."""
    if metric not in EXACT_WATCHED or not falling:  # the acceptance figures, exact at temperature 0
        return None
    oracle = [p for p in points if p.is_oracle]
    fell = [p for p in points if p.key in falling]
    if not oracle:
        return None
    if any(p.is_oracle for p in fell):
        return (f"{metric} fell on the oracle too ({sum(p.is_oracle for p in fell)} of {len(oracle)} oracle points): "
                "the pipeline changed (verification or the engine), not only a drafter")
    if any(not p.is_oracle for p in fell):
        return (f"{metric} fell only for real drafters; the oracle's {len(oracle)} point(s) are unchanged: "
                "the drafter changed, not the pipeline")
    return None
