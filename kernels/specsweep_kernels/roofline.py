"""Measured ceilings of the device and the floor of a verify-attention call.

floor = max(bytes / copy bandwidth, FLOPs / bf16 matmul rate). Bandwidth counts bytes read + written by a large
device-to-device copy; the matmul rate is a large bf16 product on random data. Ceilings are cached per GPU name
in a JSON file (default ~/.cache/specsweep/roofline.json) so a node measures them once.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specsweep_kernels.problems import Layout

__all__ = ["Ceilings", "measure_ceilings", "load_or_measure_ceilings", "verify_cost", "floor_seconds",
           "matmul_peak_tflops", "ReadStream"]

DEFAULT_CACHE = Path(os.environ.get("SPECSWEEP_ROOFLINE_CACHE", "~/.cache/specsweep/roofline.json")).expanduser()


@dataclass(frozen=True)
class Ceilings:
    device: str
    copy_gbps: float  # GB/s, read + write
    matmul_tflops: float  # bf16 dense


def copy_gbps(device: torch.device | str = "cuda", copy_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (GB/s, bytes read + written): the median of a copy_bytes copy."""
    from triton.testing import do_bench

    src = torch.randn(copy_bytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    t_copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * copy_bytes / t_copy_ms / 1e6


def measure_ceilings(device: torch.device | str = "cuda", copy_bytes: int = 2 << 30, n: int = 8192) -> Ceilings:
    from triton.testing import do_bench

    copy = copy_gbps(device, copy_bytes)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t_mm_ms = do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return Ceilings(device=torch.cuda.get_device_name(device), copy_gbps=copy, matmul_tflops=2 * n**3 / t_mm_ms / 1e9)


def load_or_measure_ceilings(device: torch.device | str = "cuda", cache: Path | None = DEFAULT_CACHE,
                             remeasure: bool = False) -> Ceilings:
    name = torch.cuda.get_device_name(device)
    table = {}
    if cache is not None and cache.exists():
        table = json.loads(cache.read_text())
        if name in table and not remeasure:
            return Ceilings(**table[name])
    ceilings = measure_ceilings(device)
    if cache is not None:
        table[name] = asdict(ceilings)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(table, indent=2))
    return ceilings


def verify_cost(*, layout: Layout, prefix_len: int, num_tokens: int, batch: int = 1, elt: int = 2,
                page_size: int = 1) -> tuple[float, float, float]:
    """(minimum bytes moved, FLOPs, unique prefix KV bytes) of one call.

    Bytes: the prefix KV once, the T new K/V rows, q, out, the index words. FLOPs: QK^T and PV over prefix + T
    keys for every query head and token, 2 * Hq * T * (L + T) * (Dk + Dv); masked-out tree entries are counted.
    """
    lay = layout
    kv = batch * prefix_len * lay.kv_bytes_per_token(elt)
    new_kv = batch * num_tokens * lay.kv_bytes_per_token(elt)
    q_out = batch * num_tokens * lay.num_q_heads * (lay.k_head_dim + lay.v_head_dim) * elt
    index = batch * 4 * -(-prefix_len // page_size)
    flops = 2.0 * batch * lay.num_q_heads * num_tokens * (prefix_len + num_tokens) * (lay.k_head_dim + lay.v_head_dim)
    return float(kv + new_kv + q_out + index), flops, float(kv)


def floor_seconds(*, nbytes: float, flops: float, ceilings: Ceilings) -> float:
    return max(nbytes / (ceilings.copy_gbps * 1e9), flops / (ceilings.matmul_tflops * 1e12))


def matmul_peak_tflops(device: torch.device | str = "cuda", n: int = 8192, repeats: int = 7) -> tuple[float, list[float]]:
    """The bf16 dense peak of this run: the median of `repeats` (>= 5) separate do_bench medians of an n x n x n
    product on random data (a bf16 product ran 13% faster on zeros than on random data, H200 2026-10-28). Returns (median TFLOP/s, every measurement)."""
    from triton.testing import do_bench

    if repeats < 5:
        raise ValueError(f"repeats={repeats}; allowed: >= 5 (the goal's compute ceiling is a median of >= 5)")
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    runs = sorted(2 * n**3 / do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median") / 1e9
                  for _ in range(repeats))
    return runs[len(runs) // 2], runs


class ReadStream:
    """A pure read of N bytes (a contiguous buffer, 16-byte loads, grid-stride, one int32 per lane written at the
    end): the memory floor of a call that must read N bytes, measured in the same run and the same way as the call
    (the caller times `fn(nbytes, programs)` and keeps the fastest of `program_counts`). The best program count
    depends on the size: on an H200 (2026-12-03) 213 MB read in 54.0 us with 4 programs a SM and 59.7 us with 8,
    537 MB in 143 us with 4 and 128 us with 8, so one count picked once put the floor 10% off."""

    BLOCK = 4096  # int32 a program loads per step (16 KB; 8 warps: four 16-byte loads a thread)
    PER_SM = (2, 4, 8, 16)  # program counts tried, in programs per SM

    def __init__(self, max_bytes: int, device: torch.device | str = "cuda") -> None:
        self.buffer = torch.randint(-2**31, 2**31 - 1, (max_bytes // 4 + self.BLOCK,), dtype=torch.int32,
                                    device=device)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.program_counts = tuple(k * sms for k in self.PER_SM)
        self.sink = torch.empty(max(self.program_counts) * self.BLOCK, dtype=torch.int32, device=device)

    def fn(self, nbytes: int, programs: int):
        """A closure that reads the first `nbytes` of the buffer once with (at most) `programs` programs."""
        n = -(-nbytes // 4)
        if n > self.buffer.numel():
            raise ValueError(f"nbytes={nbytes}; allowed: <= {4 * self.buffer.numel()} (ReadStream max_bytes)")
        if not 1 <= programs <= max(self.program_counts):
            raise ValueError(f"programs={programs}; allowed: 1..{max(self.program_counts)}")
        grid = (min(programs, -(-n // self.BLOCK)),)
        buffer, sink = self.buffer, self.sink
        return lambda: _read_kernel[grid](buffer, sink, n, BLOCK=self.BLOCK, num_warps=8)


def _read_kernel_fn():
    import triton
    import triton.language as tl

    @triton.jit
    def _read(x_ptr, sink_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(pid * BLOCK, n, step):
            acc ^= tl.load(x_ptr + start + offs, mask=start + offs < n, other=0)
        tl.store(sink_ptr + pid * BLOCK + offs, acc)

    return _read


_read_kernel = _read_kernel_fn()
