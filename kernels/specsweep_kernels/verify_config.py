"""Tiles, split counts and device limits of the verify kernels (no kernel code here).

candidate_configs / pick_config: the Triton kernel's tile for a shape under a device's shared memory per block
(sm_90 ~227 KB, sm_120 99 KB); _num_splits / _gluon_num_splits: how many prefix programs a call launches (one
wave of the SMs); _programs_per_sm: that wave, counted from the compiled kernel's resources. Each constant carries
the measurement it rests on; the runs themselves are in docs/measurements/.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from specsweep_kernels.verify_triton import kernel_is_interpreted

__all__ = ["VerifyConfig", "candidate_configs", "pick_config", "step_needs_plan"]


@dataclass(frozen=True)
class VerifyConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    warp_specialize: bool = False


@functools.lru_cache(maxsize=None)
def _device_limits(device_index: int) -> tuple[int, int]:
    """(shared memory bytes per block, multiprocessor count); CPU / interpreter: a small device."""
    if not torch.cuda.is_available():
        return 101376, 8
    props = torch.cuda.get_device_properties(device_index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 101376
    return int(smem), int(props.multi_processor_count)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)


def _smem_bytes(cfg: VerifyConfig, dk: int, dv: int, v_is_k: bool, elt: int) -> int:
    """Rough shared memory of one program: (stages - 1) KV tiles in flight plus the Q tile."""
    kv_row = dk + (0 if v_is_k else dv)
    return elt * (max(1, cfg.num_stages - 1) * cfg.block_n * kv_row + cfg.block_m * dk)


def candidate_configs(*, rows: int, dk: int, dv: int, v_is_k: bool, elt: int, smem_limit: int) -> list[VerifyConfig]:
    """Tiles in order of preference that fit the per-block shared-memory limit. rows = T * Hq / Hkv.

    The first tile that fits an H200 (227 KB a block) is the fastest of those timed there; the tiles after it are
    what a GPU with less shared memory gets (sm_120: 99 KB a block), ordered by what was timed under that limit
    (H200, 2026-12-03, docs/measurements/2026-12-03-h200/run3-tiles-sm120.log and run4-tiles-sm120.log; each a
    CUDA-graph median after a clean L2 flush, 185k prefix for MLA, 128k for GQA, the split count of _num_splits)."""
    if dv >= 512:  # MLA: the [M, 512] fp32 accumulator bounds M at 64 (8 warps)
        block_m = min(64, max(16, triton.next_power_of_2(rows)))
        first = [VerifyConfig(16, 128, 4, 2), VerifyConfig(16, 64, 4, 2)] if block_m == 16 else []
        # (block_m, 64, 8, 3): 2% faster than 2 stages at 128 heads, 32k, T = 4 and 16 (the same 216 KB; H200, 2026-12-01)
        # (16, 64, 4, 2) is the 99 KB choice for every row count: against (32, 32, 8, 2) at 32 rows 117 vs 164 us
        # (16 heads T = 2; 8 heads T = 4: 118 vs 164); against (32, 32, 4, 2) at 72 rows 248 vs 283 us (8 heads
        # T = 9), 136 rows 407 vs 433, 144 rows 418 vs 426, 64 rows 203 vs 206; it loses only at 128 rows, 370 vs
        # 361 us (8 heads T = 16): more m-blocks, but a 64-key tile and 4 warps
        candidates = first + [VerifyConfig(block_m, 64, 8, 3), VerifyConfig(block_m, 64, 8, 2),
                              VerifyConfig(16, 64, 4, 2), VerifyConfig(block_m, 32, 8, 3),
                              VerifyConfig(block_m, 32, 8, 2), VerifyConfig(min(block_m, 32), 32, 4, 2),
                              VerifyConfig(16, 32, 4, 2), VerifyConfig(16, 16, 4, 1)]
    else:
        block_m = min(128 if dv <= 128 else 64, max(16, triton.next_power_of_2(rows)))
        if rows <= 32:  # under 99 KB (block_m, 128, 4, 2), one stage less of the H200's tile (head dims <= 128,
            # where it is not what a 227 KB GPU falls back to): 143 vs 141 us for the 3-stage tile at 32 rows (GQA
            # 32/8 T = 8), against the old 99 KB picks 136 vs 157 us at 16 rows ((16, 64, 8, 3)) and 143 vs 293 us
            # at 32 ((32, 64, 8, 3))
            first = [VerifyConfig(block_m, 128, 4, 3)] + ([VerifyConfig(block_m, 128, 4, 2)] if dk <= 128 else [])
            rest = [VerifyConfig(block_m, 64, 8, 3), VerifyConfig(block_m, 64, 4, 3)]
        else:  # T = 32 and (since the unmasked main loop) T = 64: 364 vs 403 µs for (128, 128, 8, 3) at 128k
            first = [VerifyConfig(block_m, 64, 4, 4)]
            # under 99 KB 4 warps before 8 at 3 stages: 150 vs 172 us at 64 rows (GQA 32/8 T = 16), 193 vs 262 at
            # 128, 339 vs 486 at 256 (T = 32, 64)
            rest = [VerifyConfig(block_m, 64, 4, 3), VerifyConfig(block_m, 64, 8, 3)]
        candidates = first + rest + [VerifyConfig(min(block_m, 64), 32, 4, 2), VerifyConfig(16, 16, 4, 1)]
    fitting = [cfg for cfg in candidates if _smem_bytes(cfg, dk, dv, v_is_k, elt) <= smem_limit]
    return fitting or candidates[-1:]


_TOO_LARGE: set[tuple] = set()  # (config, shape key) the compiler rejected for lack of resources


def pick_config(*, rows: int, dk: int, dv: int, v_is_k: bool, elt: int, smem_limit: int) -> VerifyConfig:
    """The preferred tile that fits and that the compiler has not rejected."""
    key = (rows, dk, dv, v_is_k, elt, smem_limit)
    configs = candidate_configs(rows=rows, dk=dk, dv=dv, v_is_k=v_is_k, elt=elt, smem_limit=smem_limit)
    return next((cfg for cfg in configs if (cfg, key) not in _TOO_LARGE), configs[-1])


def step_needs_plan(batch: int) -> bool:
    """Whether a step of `batch` requests runs from a plan (plan_verify). Batch 1 does not: both kernels cut its
    prefix into P equal tile-aligned slices in the kernel (a plan measured 1-14% slower there, H200
    2026-12-01), so an engine plans nothing for it."""
    return batch > 1


def _num_splits(*, num_kv_heads: int, m_blocks: int, slots: int, max_splits: int) -> int:
    """Prefix programs per (m-block, KV head): one full wave, slots = SMs x programs resident per SM. The batch's
    prefix work is shared among them by the plan (_plan_kernel), whatever the mix of lengths. More programs only add
    workspace traffic, and a partial second wave costs a whole one (both measured on an H200)."""
    return max(1, min(max_splits, slots // (num_kv_heads * m_blocks)))


def _gluon_num_splits(*, m_blocks: int, batch: int, slots: int, max_splits: int) -> int:
    """Prefix programs per m-block of the Gluon MLA kernels (one program per SM): one wave, as _num_splits, except
    that at batch 1 with <= 2 m-blocks one prefix program fewer lets the new-token program(s) run in the first wave
    (0.1-1.0 us a call, H200 2026-12-01; with more m-blocks the lost prefix share costs more than the wave: 128 heads T = 16,
    P 4 -> 3, 335 -> 442 us, the same day)."""
    num_splits = _num_splits(num_kv_heads=1, m_blocks=m_blocks, slots=slots, max_splits=max_splits)
    if not step_needs_plan(batch) and m_blocks <= 2 and m_blocks * (num_splits + 1) > slots and num_splits > 1:
        num_splits -= 1
    return num_splits


_OCCUPANCY: dict[tuple, int] = {}


def _programs_per_sm(kernel, args: tuple, constexprs: dict, q: Tensor) -> int:
    """Attention programs resident per SM, from the compiled kernel's shared memory, registers and warps."""
    if kernel_is_interpreted():
        return 1
    key = (kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), q.device, q.dtype,
           tuple(sorted(constexprs.items())))
    if key not in _OCCUPANCY:
        compiled = kernel.warmup(*args, grid=(1,), **constexprs)
        try:
            compiled._init_handles()  # raises OutOfResources when the tile does not fit
            shared, n_regs = compiled.metadata.shared, compiled.n_regs
        except AttributeError:  # another Triton's internals: assume one program per SM
            _OCCUPANCY[key] = 1
            return 1
        props = torch.cuda.get_device_properties(q.device)
        threads = 32 * constexprs["num_warps"]
        smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
        regs = getattr(props, "regs_per_multiprocessor", 65536)
        max_threads = getattr(props, "max_threads_per_multi_processor", 2048)
        _OCCUPANCY[key] = max(1, min(smem // max(1, shared), regs // max(1, n_regs * threads), max_threads // threads))
    return _OCCUPANCY[key]


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)
