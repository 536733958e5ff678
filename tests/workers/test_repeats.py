"""`probe.repeats=N`: N prompts per point, each a different text of the same kind, combined into a mean and a 95 %
interval per metric (workers/prompts.py, workers/repeats.py, GroupRunner on the real reference engine)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

import workers.runners as sw
from specsweep_common.point_key import point_key
from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec, RunState, stable_hash
from specsweep_common.confidence_interval import interval
from workers.measurement import Measurement
from workers.prompts import NOVEL_NGRAM, build_prompt, probe_text
from workers.repeats import combine
from tools.testing import tiny_run, tiny_server


def _probe(kind: ProbeKind, repeats: int = 4, **kw) -> ProbeSpec:
    return ProbeSpec(kind=kind, context_len=512, gen_tokens=8, repeats=repeats, **kw)


def test_predictable_repeats_are_different_sentences_each_repeated():
    probe = _probe(ProbeKind.PREDICTABLE)
    texts = [probe_text(probe, 600, r) for r in range(4)]
    assert texts[0] == probe_text(dataclasses.replace(probe, repeats=1), 600)  # repeat 0 is today's text
    assert len(set(texts)) == 4
    for t in texts:  # each the same kind: one sentence of as many words as the default, repeated
        period = t.index(". ") + 2
        sentence = t[:period]
        assert len(sentence.split()) == len(probe.sentence.split())
        assert t == sentence * (len(t) // period) + t[: len(t) % period]


def test_novel_repeats_are_different_texts_each_without_a_repeated_ngram():
    probe = _probe(ProbeKind.NOVEL, seed=7)
    texts = [probe_text(probe, 3000, r) for r in range(4)]
    assert texts[0] == probe_text(dataclasses.replace(probe, repeats=1), 3000)
    assert len(set(texts)) == 4
    for t in texts:
        words = re.findall(r"[a-z]+", t.lower())
        grams = [tuple(words[i:i + NOVEL_NGRAM]) for i in range(len(words) - NOVEL_NGRAM + 1)]
        assert len(grams) == len(set(grams))
    # seed 7's repeats are not seed 8's texts
    other = {probe_text(dataclasses.replace(probe, seed=8), 3000, r) for r in range(4)}
    assert not other & set(texts)


def test_file_repeats_are_other_windows_of_the_file(tmp_path):
    f = tmp_path / "doc.txt"
    lines = [f"line {i} of the document says something different each time." for i in range(40)]
    f.write_text("\n".join(lines) + "\n")
    probe = _probe(ProbeKind.FILE, path=str(f))
    texts = [probe_text(probe, 100, r) for r in range(4)]
    assert len(set(texts)) == 4
    starts = [int(t.split()[1]) for t in texts]  # from about r/repeats of the file on, at a line start
    assert starts[0] == 0 and all(t.startswith("line ") for t in texts)
    assert len(set(starts)) == 4 and starts == sorted(starts), starts
    whole = f.read_text()
    assert all(len(t) == len(whole) and t in whole + whole for t in texts)  # the file, wrapped


def test_a_repeat_outside_probe_repeats_is_refused():
    with pytest.raises(ValueError, match=r"repeat 3 of probe.repeats=3: allowed 0 \.\. 2"):
        build_prompt(_probe(ProbeKind.NOVEL, repeats=3), EngineKind.REFERENCE, repeat=3)


def test_default_repeats_keeps_the_recorded_run_hash_and_other_counts_are_other_points():
    server = tiny_server("ngram")
    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=256, gen_tokens=32)
    # recorded on main before probe.repeats existed (2026-12-03): resume and history still find those runs
    assert stable_hash(server, probe) == "2281dfd44598a059eee5f52b34e733c0754f1b7911b494c96d47171085b32f6d"
    assert point_key(server, probe) == "98fc099350ed1b2b"
    three = dataclasses.replace(probe, repeats=3)
    assert stable_hash(server, three) != stable_hash(server, probe)
    assert point_key(server, three) != point_key(server, probe)  # a mean over 3 texts is another quantity


def test_combine_records_mean_t_interval_count_and_the_values():
    parts = [Measurement(metrics={"decode_tok_s": v, "requests": 1.0}) for v in (10.0, 12.0, 14.0)]
    parts[1].metrics["verify_step_ms"] = 5.0
    parts[2].notes.append("asked 8 tokens, engine generated 7")
    m, tags = combine(parts)
    ci = interval([10.0, 12.0, 14.0])
    assert m.metrics["decode_tok_s"] == 12.0
    assert m.metrics["decode_tok_s.ci95_lo"] == pytest.approx(12.0 - 4.303 * 2.0 / 3 ** 0.5)
    assert (m.metrics["decode_tok_s.ci95_lo"], m.metrics["decode_tok_s.ci95_hi"]) == (ci.lo, ci.hi)
    assert m.metrics["decode_tok_s.n"] == 3.0 and m.metrics["verify_step_ms.n"] == 1.0
    assert json.loads(tags["decode_tok_s.repeats"]) == [10.0, 12.0, 14.0]
    assert "repeat 2: asked 8 tokens, engine generated 7" in m.notes
    assert "verify_step_ms measured on 1 of 3 repeats" in m.notes
    single = Measurement(metrics={"decode_tok_s": 3.0})
    assert combine([single]) == (single, {})  # probe.repeats=1: the run is recorded exactly as before


def test_runner_probes_each_repeat_and_records_mean_and_interval(tmp_path, monkeypatch):
    sent = []
    real = sw.run_probe

    def spy(base_url, probe, engine, **kw):  # the real probe; records which repeat and prompt it sent
        sent.append((kw["repeat"], build_prompt(probe, engine, kw.get("model_path"), repeat=kw["repeat"])))
        return real(base_url, probe, engine, **kw)

    monkeypatch.setattr(sw, "run_probe", spy)
    server = tiny_server("ngram")
    spec = tiny_run(server, 0, ProbeKind.PREDICTABLE, context_len=96, gen_tokens=12)
    spec = dataclasses.replace(spec, probe=dataclasses.replace(spec.probe, repeats=3))
    runner = sw.GroupRunner(server, tmp_path)
    try:
        result = runner.run(spec)
    finally:
        runner.stop()
    assert result.state is RunState.FINISHED, result.message
    assert [r for r, _ in sent] == [0, 1, 2] and len({p.input_ids for _, p in sent}) == 3
    assert all(p.num_tokens == 96 for _, p in sent)
    for metric in ("commit_len_mean", "decode_tok_s", "verify_step_ms", "prompt_tokens"):
        values = json.loads(result.tags[f"{metric}.repeats"])
        assert len(values) == 3
        assert result.metrics[metric] == pytest.approx(sum(values) / 3)
        assert result.metrics[f"{metric}.n"] == 3.0
        assert result.metrics[f"{metric}.ci95_lo"] <= result.metrics[metric] <= result.metrics[f"{metric}.ci95_hi"]
    assert json.loads(result.tags["prompt_tokens.repeats"]) == [96.0, 96.0, 96.0]
