"""Compile the portable verify kernel for a GPU that is not here, and read what it would need.

    info = compile_for_target(capability=(12, 0), dk=576, dv=512, v_is_k=True, group=8, num_tokens=9,
                              config=pick_config(rows=72, dk=576, dv=512, v_is_k=True, elt=2,
                                                 smem_limit=SM120.smem_per_block))
    info.shared <= SM120.smem_per_block and not info.wgmma and not info.tma

Triton compiles for any target on a machine without a GPU (ptxas ships with it), so the tile picker's choices for
sm_120 (RTX 50xx / RTX PRO 6000 Blackwell: 99 KB of shared memory per block, no wgmma, no Hopper TMA) are checked
on the compiled kernel's own shared-memory figure, not on the picker's estimate.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specsweep_kernels.verify_config import VerifyConfig
from specsweep_kernels.verify_triton import _verify_attention_kernel, kernel_is_interpreted

__all__ = ["SM120", "TargetLimits", "CompiledInfo", "compile_for_target"]


@dataclass(frozen=True)
class TargetLimits:
    capability: tuple[int, int]
    smem_per_block: int  # bytes a block may opt in to


# sm_120: 100 KB per SM, of which a block may take 99 KB (CUDA programming guide, compute capability 12.0)
SM120 = TargetLimits(capability=(12, 0), smem_per_block=99 * 1024)


@dataclass(frozen=True)
class CompiledInfo:
    shared: int  # bytes of shared memory the compiled kernel asks for
    wgmma: bool  # Hopper warpgroup MMA in the PTX
    tma: bool  # Hopper bulk tensor copies in the PTX


_POINTERS = {"tree_mask_ptr": "*u8", "kv_indices_ptr": "*i32", "kv_indptr_ptr": "*i32", "prefix_lens_ptr": "*i32",
             "items_ptr": "*i32", "order_ptr": "*i32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}


def compile_for_target(*, capability: tuple[int, int], dk: int, dv: int, v_is_k: bool, group: int, num_tokens: int,
                       config: VerifyConfig, page_size: int = 1, batch_one: bool = True,
                       dtype: str = "bf16") -> CompiledInfo:
    """Compile _verify_attention_kernel for sm_<capability> with this tile (no GPU needed) and report its needs.
    Needs the compiled kernels: in a process where TRITON_INTERPRET=1 was set before import it raises RuntimeError
    (run it in a process without it, as tests/kernels/test_portable_targets.py does)."""
    if kernel_is_interpreted():
        raise RuntimeError("compile_for_target: TRITON_INTERPRET=1 made the kernels interpreted in this process; "
                           "allowed: a process where it was not set before specsweep_kernels was imported")
    block_d, block_dpe = (dv, dk - dv) if v_is_k else (dk, 0)
    constexprs = dict(NUM_KV_HEADS=1, GROUP=group, T=num_tokens, BLOCK_T=max(16, triton.next_power_of_2(num_tokens)),
                      BLOCK_D=block_d, BLOCK_DPE=block_dpe, BLOCK_DV=dv, BLOCK_M=config.block_m,
                      BLOCK_N=config.block_n, PAGE_SIZE=page_size, USE_INDPTR=False, V_IS_K=v_is_k,
                      SINGLE_REQUEST=batch_one, DOT_PRECISION="tf32", WARP_SPECIALIZE=config.warp_specialize,
                      PDL=False)
    params = list(inspect.signature(_verify_attention_kernel.fn).parameters)
    signature = {}
    for name in params:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = _POINTERS.get(name, f"*{dtype}")
        elif name == "qk_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(_verify_attention_kernel, signature,
                       constexprs={(params.index(k),): v for k, v in constexprs.items()})
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    compiled = triton.compile(source, target=target,
                              options=dict(num_warps=config.num_warps, num_stages=config.num_stages))
    ptx = compiled.asm.get("ptx", "")
    return CompiledInfo(shared=int(compiled.metadata.shared), wgmma="wgmma" in ptx,
                        tma="cp.async.bulk.tensor" in ptx)
