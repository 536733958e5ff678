"""The answer's files: SGLang's adaptive-config JSON where the algorithm allows it, launch commands otherwise."""

from __future__ import annotations

import json
import shlex

import pytest

from orchestrator.tune.answer import AnswerRow, adaptive_config, answer_csv, answer_markdown, launch_commands
from orchestrator.tune.robust import Entry, pick


def row(batch, winner_key, steps, algo="EAGLE", topk=1, others=()):
    entries = [Entry(winner_key, f"steps={steps}", steps + 1 if steps else 0, (100.0, 100.0, 100.0)),
               *(Entry(k, k, 0, (50.0, 50.0, 50.0)) for k in others)]
    values = {winner_key: {"drafter": "eagle", "drafter.num_steps": str(steps), "drafter.topk": str(topk),
                           "page_size": "16"}, **{k: {"drafter": "none"} for k in others}}
    algos = {winner_key: algo, **{k: "NONE" for k in others}}
    return AnswerRow(1024, batch, pick(entries, 0.01), algos, values)


def test_adaptive_config_pins_each_batch_size_to_its_winner_in_sglangs_format(tmp_path):
    rows = [row(1, "w1", 5, others=("n",)), row(8, "w8", 3), row(32, "w32", 1)]
    cfg, why = adaptive_config(rows)
    assert cfg == {"1": {"candidate_steps": [5]}, "8": {"candidate_steps": [3]}, "32": {"candidate_steps": [1]}}
    # SGLang's own loader reads it and routes each batch size to the winner measured for its range
    # (sglang/srt/speculative/adaptive_spec_params.py:103-139 `_load_adaptive_config`, :356-358 `_find_closest_bs`)
    adaptive = pytest.importorskip("sglang.srt.speculative.adaptive_spec_params")
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(cfg))
    params = adaptive.AdaptiveSpeculativeParams(initial_steps=5, cfg_path=str(path))
    assert [params.get_steps_for_batch(b) for b in (1, 7, 8, 31, 32, 100)] == [5, 5, 3, 3, 1, 1]
    assert adaptive.resolve_candidate_steps_from_config(str(path)) == [1, 3, 5]


def test_no_adaptive_config_for_algorithms_sglang_does_not_adapt():
    cfg, why = adaptive_config([row(1, "w", 4, algo="NGRAM")])
    assert cfg is None and "EAGLE" in why
    cfg, why = adaptive_config([row(1, "w", 4, topk=2)])
    assert cfg is None and "topk" in why


def test_launch_commands_one_per_batch_range_with_the_winners_flags():
    text = launch_commands([row(1, "w1", 5), row(8, "w8", 3)], "Qwen/Qwen3-8B")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(lines) == 2
    first = shlex.split(lines[0])
    assert first[:3] == ["python", "-m", "sglang.launch_server"]
    assert first[first.index("--speculative-num-steps") + 1] == "5"
    assert "# batch 1-7: steps=5" in text and "# batch 8+: steps=3" in text


def test_table_and_csv_name_the_margins():
    rows = [row(1, "w1", 5, others=("n",))]
    md = answer_markdown(rows)
    assert "| 1024 | 1 | steps=5 | 100 | +100.0% | n |" in md
    assert answer_csv(rows).splitlines()[1].startswith("1024,1,w1,100,100,1,True,n,1,True")
