"""Rule (f), the lossless check, on recorded rows: equal tokens pass, a divergence at a numerical tie passes (and the
rest is not compared), any other divergence is a pipeline bug naming both runs, the position, the tokens and the
gap; what cannot be checked is listed with why."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.settings import Thresholds
from orchestrator.results.diagnosis import Cause, Rule, RunRow, Verdict, diagnose, find_lossless_breach
from orchestrator.results.diagnosis_md import render_markdown
from specsweep_common.greedy_output import GreedyOutput

TH = Thresholds()
IDS = (10, 11, 12, 13, 14, 15, 16, 17)


def top2(ids, gaps=None) -> tuple:
    """Top-2 per position: the emitted token first; the runner-up token 99 at `gaps[k]` (default 5) below it."""
    gaps = gaps or {}
    return tuple(((-0.5, t), (-0.5 - gaps.get(k, 5.0), 99)) for k, t in enumerate(ids))


def row(name: str, ids, *, speculative=True, key="p1", top=None, temperature=0.0, dtype="float32", engine="reference",
        **kw) -> RunRow:
    return RunRow(run_id=f"{name:0<12}", name=name, context_len=1024, probe="predictable",
                  drafter="ngram" if speculative else "none", attention="torch", page_size=16, engine=engine,
                  speculative=speculative, temperature=temperature, dtype=dtype, lossless_key=key,
                  output=GreedyOutput(tuple(ids), top or ()), **kw)


def base(ids=IDS, gaps=None, **kw) -> RunRow:
    return row("none", ids, speculative=False, top=top2(ids, gaps), **kw)


def check(rows) -> tuple[list, list]:
    return find_lossless_breach(rows, TH)


def test_equal_tokens_pass():
    findings, checks = check([row("spec", IDS), base()])
    assert findings == [] and len(checks) == 1 and checks[0].evaluated
    assert checks[0].detail == "1 of 1 speculative run(s) at temperature 0 produce the drafter=none run's tokens"


def test_a_divergence_at_a_tie_passes_and_the_rest_is_not_compared():
    spec = IDS[:3] + (99, 1, 2, 3, 4)  # parts at 3 for the runner-up, then anything: the texts legitimately part
    findings, checks = check([row("spec", spec), base(gaps={3: TH.lossless_tie_gap / 2})])
    assert findings == [] and checks[0].evaluated and "1 part at a tie: `spec` tie at 3" in checks[0].detail


def test_a_divergence_beyond_the_tolerance_is_a_pipeline_bug_naming_both_runs():
    spec = IDS[:3] + (99,) + IDS[4:]
    gap = TH.lossless_tie_gap * 2
    findings, checks = check([row("spec", spec), base(gaps={3: gap})])
    (f,) = findings
    assert f.cause is Cause.PIPELINE_BUG and f.run_ids == ("spec00000000", "none00000000")
    (evidence,) = f.evidence
    assert "`spec` (run spec0000) vs `none` (run none0000): first divergence at output position 3" in evidence
    assert "token 99 with speculation, 13 without" in evidence and f"gap {gap:.3g} > tie tolerance" in evidence
    assert checks[0].detail.startswith("0 of 1 speculative run(s)")


def test_a_token_outside_the_none_runs_top_two_is_a_bug_whatever_the_gap():
    spec = IDS[:2] + (55,) + IDS[3:]  # 55 is not among the none-run's top two (12, 99), which are tied
    (f,), _ = check([row("spec", spec), base(gaps={2: 0.0})])
    assert "its top two are 12 and 99 (logprobs -0.5 vs -0.5), so 55 is not a greedy choice there" in f.evidence[0]


def test_a_shorter_speculative_output_is_a_bug():
    (f,), _ = check([row("spec", IDS[:6]), base()])
    assert "agree on their first 6 tokens, then one ends: 6 output tokens with speculation, 8 without" in f.evidence[0]


def test_16bit_models_get_their_own_tolerance():
    spec = IDS[:3] + (99,) + IDS[4:]
    gap = (TH.lossless_tie_gap + TH.lossless_tie_gap_16bit) / 2  # above float32's, within 16-bit's
    assert TH.lossless_tie_gap < gap <= TH.lossless_tie_gap_16bit
    assert check([row("spec", spec, dtype="bfloat16"), base(gaps={3: gap}, dtype="bfloat16")])[0] == []
    assert len(check([row("spec", spec), base(gaps={3: gap})])[0]) == 1


def test_without_a_none_run_of_the_same_point_it_is_not_checked():
    findings, checks = check([row("spec", IDS, key="other"), base()])
    (c,) = checks
    assert findings == [] and not c.evaluated
    assert "1 speculative run(s) have no drafter=none run of the same point (add drafter=none to the grid): `spec`" \
        in c.detail


def test_temperature_above_zero_is_not_checked():
    findings, checks = check([row("hot", (1, 2, 3), temperature=0.7), row("spec", IDS), base()])
    assert findings == [] and [c.evaluated for c in checks] == [True, False]
    assert "1 run(s) sample at temperature > 0, where texts legitimately differ: `hot`" in checks[1].detail


def test_runs_recorded_without_outputs_are_named():
    old = dataclasses.replace(row("old", IDS), output=None)
    _, checks = check([old, base()])
    assert not checks[0].evaluated and "or their drafter=none run recorded no output_ids.json" in checks[0].detail
    _, checks = check([row("spec", IDS), dataclasses.replace(base(), output=None)])  # the none-run's missing
    assert [c.evaluated for c in checks] == [False] and "`spec`" in checks[0].detail
    # an unpaired run is named as unpaired, whether its output was read or not (the report reads paired ones only)
    _, checks = check([dataclasses.replace(row("spec", IDS, key="other"), output=None), base()])
    assert "have no drafter=none run of the same point" in checks[0].detail


def test_a_none_run_without_logprobs_cannot_show_a_tie():
    spec = IDS[:3] + (99,) + IDS[4:]
    (f,), _ = check([row("spec", spec), dataclasses.replace(base(), output=GreedyOutput(IDS))])
    assert "recorded no top-2 logprobs at 3, so no tie can be shown" in f.evidence[0]


def test_a_sweep_without_speculation_has_nothing_to_check():
    assert check([base()]) == ([], [])


@pytest.mark.parametrize("bug", [False, True])
def test_the_report_says_it(bug):
    spec = IDS[:3] + (99,) + IDS[4:] if bug else IDS
    d = diagnose([row("spec", spec), base(gaps={3: 1.0})])
    text = render_markdown(d, "s")
    c = next(c for c in d.checks if c.rule is Rule.LOSSLESS)
    assert c.evaluated and d.verdict is not Verdict.HEALTHY  # the other rules lack what they need
    assert ("## pipeline bug" in text) is bug
    assert "(f) speculative text equals the text without speculation (lossless check): " in text


def test_greedy_output_round_trips_and_refuses_malformed_records():
    out = GreedyOutput(IDS, top2(IDS))
    assert GreedyOutput.from_json(out.to_json()) == out
    assert GreedyOutput.from_json('{"output_ids": [1, 2]}') == GreedyOutput((1, 2))
    with pytest.raises(ValueError, match="output_ids must be a list of token ids"):
        GreedyOutput.from_json('{"output_ids": [1, "2"]}')
    with pytest.raises(ValueError, match="not best first"):
        GreedyOutput.from_json('{"output_ids": [1], "top_logprobs": [[[-3.0, 1], [-1.0, 2]]]}')
    with pytest.raises(ValueError, match="need the 2 best entries"):
        GreedyOutput.from_json('{"output_ids": [1], "top_logprobs": [[[-3.0, 1]]]}')
