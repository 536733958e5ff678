"""`diagnosis.md`: an `orchestrator.results.diagnosis.Diagnosis` as Markdown (the verdict, each finding with its evidence,
then the rules checked and those not checked, each with why). Also says which runs no rule or only some rules
examined: the stub engine's (simulated) and those on dummy weights (orchestrator/config/weights_scope.py)."""

from __future__ import annotations

from orchestrator.results.diagnosis import Diagnosis, Verdict
from orchestrator.config.weights_scope import dummy_note


def render_markdown(diagnosis: Diagnosis, sweep: str, earlier: int = 0) -> str:
    """`earlier`: how many of the runs examined were recorded by earlier invocations of the sweep (resume)."""
    d = diagnosis
    examined = f"{d.runs} run(s) examined"
    if earlier:
        examined += f" ({earlier} of them from earlier invocations of this sweep, skipped on resume)"
    lines = [f"# Diagnosis: {sweep}", "", examined + "."]
    if d.simulated:
        lines += ["", (f"{d.simulated} run(s) ran on the stub engine: their commits and timings are simulated "
                       f"(workers/stub/server.py), so no rule examines them.")]
    if d.dummy_weights:
        lines += ["", dummy_note(d.dummy_weights)]
    verdict = d.verdict
    if verdict is Verdict.NO_RUNS:
        lines += ["", "**No verdict**: no FINISHED run of a real engine to examine, so nothing was checked."]
        return "\n".join(lines) + "\n"
    if verdict is Verdict.HEALTHY:
        lines += ["", "**Healthy**: every rule was evaluated and none fired."]
    elif verdict is Verdict.INCOMPLETE:
        lines += ["", (f"**No verdict**: no rule fired, but {len(d.not_evaluated)} of {len(d.checks)} could not "
                       f"be evaluated on this sweep (listed under \"Not checked\"), so it is not called healthy.")]
    for f in d.findings:
        lines += ["", f"## {f.cause.value}", "", f.summary, ""] + [f"- {e}" for e in f.evidence]
    checked = [c for c in d.checks if c.evaluated]
    if checked:
        lines += ["", "## Checked", ""] + [f"- {c.rule.value}: {c.detail}" for c in checked]
    if d.not_evaluated:
        lines += ["", "## Not checked", ""] + [f"- {c.rule.value}: {c.detail}" for c in d.not_evaluated]
    return "\n".join(lines) + "\n"
