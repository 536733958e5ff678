"""The H200 end-to-end benchmark's own code path, shrunk to run on CPU: rows, floor inputs, profile file."""
from __future__ import annotations

import json

from tools import h200_e2e


def test_e2e_benchmark_runs_small_on_cpu(tmp_path):
    rc = h200_e2e.main(["--device", "cpu", "--dtype", "float32", "--layers", "2", "--hidden", "128", "--heads", "4",
                        "--kv-heads", "2", "--head-dim", "32", "--intermediate", "256", "--vocab", "512",
                        "--contexts", "64", "200", "--backends", "torch", "--steps", "2", "--torch-steps", "2",
                        "--warmup", "1", "--profile", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "e2e.json").read_text())
    rows = result["rows"]
    assert [(r["backend"], r["ctx"]) for r in rows] == [("torch", 64), ("torch", 200)]
    for r in rows:
        assert r["steps"] == 2 and r["verify_ms"] > 0 and r["step_ms"] >= r["verify_ms"]
        assert r["commit_mean"] == 8.0  # the oracle drafter commits num_steps + 1 on CPU fp32
    # 2 layers x 2 KV heads x (K + V) x 32 dims x 4 bytes
    assert result["info"]["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    profile = (tmp_path / "profile-torch-200.txt").read_text()
    assert "aten::" in profile  # a real profiler table of the largest context's steps
    assert "torch" in (tmp_path / "e2e.md").read_text()
