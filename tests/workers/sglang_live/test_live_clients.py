"""SGLang 0.5.18's own load generator, `bench_serving`, in its three request modes (native /generate,
/v1/completions, /v1/chat/completions), against the live SGLang server and against the reference engine."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tools.testing import reference_process

from .conftest import CONTEXT

MODES = ("sglang", "sglang-oai", "sglang-oai-chat")


def _bench(python: str, url: str, mode: str, tokenizer: str, cwd: Path) -> str:
    """bench_serving writes its result file (<backend>_<date>_<prompts>_<in>_<out>.jsonl) into its working
    directory: `cwd` is the test's own."""
    argv = [python, "-m", "sglang.bench_serving", "--backend", mode, "--base-url", url, "--dataset-name", "random-ids",
            "--random-input-len", "48", "--random-output-len", "4", "--random-range-ratio", "1", "--num-prompts", "2",
            "--tokenizer", tokenizer, "--model", tokenizer, "--disable-tqdm", "--seed", "1"]
    out = subprocess.run(argv, text=True, capture_output=True, timeout=600, cwd=cwd,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert out.returncode == 0, (mode, out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


def _successful(report: str) -> int:
    found = re.search(r"Successful requests:\s+(\d+)", report)
    assert found, report[-2000:]
    return int(found.group(1))


@pytest.mark.parametrize("mode", MODES)
def test_bench_serving_against_live_sglang(manifest, live, mode, tmp_path):
    _, engine = live
    tokenizer = manifest["models"]["smollm2-135m"]
    assert _successful(_bench(manifest["python"], engine.base_url, mode, tokenizer, tmp_path)) == 2


def test_bench_serving_against_the_reference_engine(manifest, tmp_path):
    tokenizer = manifest["models"]["smollm2-135m"]
    argv = ["--model-path", "smollm2-135m", "--context-length", str(CONTEXT)]
    with reference_process(argv) as (url, _):
        for mode in MODES:
            assert _successful(_bench(manifest["python"], url, mode, tokenizer, tmp_path)) == 2, mode
