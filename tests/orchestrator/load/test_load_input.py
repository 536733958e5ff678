"""Bad input to `specsweep +load=...` stops the command before Ray, MLflow or any server starts, naming the key, the
value and what is allowed (a real subprocess: the Hydra sweeper's checks, orchestrator/load/entry.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "kernels"), *filter(None, [os.environ.get("PYTHONPATH")])])


def _specsweep(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": PYTHONPATH}
    return subprocess.run([sys.executable, "-m", "orchestrator", *overrides], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("override, key, allowed", [
    ("hydra.sweeper.load.concurrency=[1,-2]", "hydra.sweeper.load.concurrency[1]=-2", "an integer in [1, 4096]"),
    ("hydra.sweeper.load.concurrency=[1,high]", "hydra.sweeper.load.concurrency[1]='high'", "an integer in"),
    ("hydra.sweeper.load.tokenizer=/no/such/tokenizer", "hydra.sweeper.load.tokenizer='/no/such/tokenizer'",
     "a tokenizer directory that exists"),
    ("engine=stub", "engine.kind='stub'", "an engine that SGLang's bench_serving runs against"),
    ("drafter=none,ngram", "drafter='drafter=none,ngram'", "one value: a load curve is of one configuration"),
])
def test_bad_input_names_the_key_and_starts_nothing(tmp_path, override, key, allowed):
    out = _specsweep(tmp_path, "+load=curve", "model=tiny", override)
    assert out.returncode == 1
    text = out.stderr + out.stdout
    assert key in text and allowed in text, text[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "load_logs").exists()
