"""The portable kernel's tiles for sm_120 (99 KB of shared memory a block, no wgmma, no Hopper TMA), checked on the
kernel Triton compiles for sm_120 here, without that GPU: its shared memory, not the picker's estimate."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specsweep_kernels.verify_config import pick_config
from specsweep_kernels.verify_targets import SM120

# (dk, dv, MLA, query heads per KV head, T): MLA at 8 / 16 heads (the original workload's decode, chain and tree
# widths) and GQA 32/8 d128; shapes whose tile and new-token tile coincide are compiled once (the head count only
# changes index arithmetic)
SHAPES = [(576, 512, True, 8, 1), (576, 512, True, 16, 2), (576, 512, True, 8, 9), (576, 512, True, 16, 17),
          (128, 128, False, 4, 8), (128, 128, False, 4, 16)]


def _compile(cases: list[tuple]) -> list[dict]:
    """compile_for_target for each (dk, dv, mla, group, tokens, (block_m, block_n, warps, stages)), in a fresh
    process without TRITON_INTERPRET (this one may have set it: the kernels would be interpreted)."""
    code = (
        "import json, sys\n"
        "from specsweep_kernels.verify_config import VerifyConfig\n"
        "from specsweep_kernels.verify_targets import SM120, compile_for_target\n"
        "out = []\n"
        "for dk, dv, mla, group, tokens, cfg in json.loads(sys.argv[1]):\n"
        "    info = compile_for_target(capability=SM120.capability, dk=dk, dv=dv, v_is_k=mla, group=group,\n"
        "                              num_tokens=tokens, config=VerifyConfig(*cfg))\n"
        "    out.append(dict(shared=info.shared, wgmma=info.wgmma, tma=info.tma))\n"
        "print(json.dumps(out))\n")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{root}:{root / 'kernels'}"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tile(config) -> tuple[int, int, int, int]:
    return (config.block_m, config.block_n, config.num_warps, config.num_stages)


@pytest.fixture(scope="module")
def sm120_builds() -> dict:
    """Each distinct (tile, new-token tile) of SHAPES under sm_120's limit, compiled for sm_120 once."""
    cases, keys = [], []
    for dk, dv, mla, group, tokens in SHAPES:
        config = pick_config(rows=group * tokens, dk=dk, dv=dv, v_is_k=mla, elt=2, smem_limit=SM120.smem_per_block)
        key = (dk, dv, mla, _tile(config), max(16, 1 << (tokens - 1).bit_length()))  # BLOCK_T: the new-token tile
        if key not in keys:
            keys.append(key)
            cases.append((dk, dv, mla, group, tokens, _tile(config)))
    return dict(zip(keys, _compile(cases)))


@pytest.mark.parametrize("dk,dv,mla,group,tokens", SHAPES)
def test_sm120_tiles_fit_its_shared_memory_and_use_no_hopper_instructions(dk, dv, mla, group, tokens, sm120_builds):
    config = pick_config(rows=group * tokens, dk=dk, dv=dv, v_is_k=mla, elt=2, smem_limit=SM120.smem_per_block)
    info = sm120_builds[(dk, dv, mla, _tile(config), max(16, 1 << (tokens - 1).bit_length()))]
    assert info["shared"] <= SM120.smem_per_block, (config, info)
    assert not info["wgmma"] and not info["tma"], (config, info)


def test_the_h200_first_choice_would_not_fit_sm120():
    """The check has teeth: the tile picked for an H200 (227 KB a block) at 8 heads x T 9 needs more than sm_120
    has, so the picker must be asked with sm_120's limit."""
    config = pick_config(rows=72, dk=576, dv=512, v_is_k=True, elt=2, smem_limit=232448)
    [info] = _compile([(576, 512, True, 8, 9, _tile(config))])
    assert info["shared"] > SM120.smem_per_block


# main's picks on an H200 (227 KB a block) before the 99 KB tiles were reordered, per head dim (576 = MLA) and rows
H200_PICKS = {
    576: {1: (16, 128, 4, 2), 8: (16, 128, 4, 2), 16: (16, 128, 4, 2), 32: (32, 64, 8, 3), 64: (64, 64, 8, 3), 72: (64, 64, 8, 3), 128: (64, 64, 8, 3), 256: (64, 64, 8, 3), 1024: (64, 64, 8, 3)},
    128: {1: (16, 128, 4, 3), 8: (16, 128, 4, 3), 16: (16, 128, 4, 3), 32: (32, 128, 4, 3), 64: (64, 64, 4, 4), 72: (128, 64, 4, 4), 128: (128, 64, 4, 4), 256: (128, 64, 4, 4), 1024: (128, 64, 4, 4)},
    256: {1: (16, 64, 8, 3), 8: (16, 64, 8, 3), 16: (16, 64, 8, 3), 32: (32, 64, 8, 3), 64: (64, 64, 4, 4), 72: (64, 64, 4, 4), 128: (64, 64, 4, 4), 256: (64, 64, 4, 4), 1024: (64, 64, 4, 4)},
    64: {1: (16, 128, 4, 3), 8: (16, 128, 4, 3), 16: (16, 128, 4, 3), 32: (32, 128, 4, 3), 64: (64, 64, 4, 4), 72: (128, 64, 4, 4), 128: (128, 64, 4, 4), 256: (128, 64, 4, 4), 1024: (128, 64, 4, 4)},
}


def test_h200_tiles_are_unchanged():
    """The 99 KB tiles were added after the first tile that fits 227 KB: an H200 (and any GPU with as much shared
    memory a block) keeps every tile it had."""
    for dk, picks in H200_PICKS.items():
        for rows, expected in picks.items():
            config = pick_config(rows=rows, dk=dk, dv=512 if dk == 576 else dk, v_is_k=dk == 576, elt=2,
                                 smem_limit=232448)
            assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == expected, (dk, rows)
