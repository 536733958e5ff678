"""GPU telemetry: CUDA_VISIBLE_DEVICES -> NVML mapping, the no-GPU path, and sampling arithmetic.

NVML needs an NVIDIA driver, which this machine cannot have: the sampling test drives the sampler
through a small NVML stand-in with NVML's function names and units (mW, bytes, percent).
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from workers.telemetry import GpuSampler, gpu_identity, parse_visible_devices


@pytest.mark.parametrize("value, count, expected", [
    (None, 4, [0, 1, 2, 3]),
    ("", 4, []),
    ("2,3", 8, [2, 3]),
    ("5, 1", 8, [5, 1]),  # CUDA order is the listed order
    ("1,9,2", 4, [1]),  # CUDA stops at the first invalid index
    ("0,foo,1", 4, [0]),
    ("GPU-8d2f1c3e-aaaa,3", 4, ["GPU-8d2f1c3e-aaaa", 3]),
    ("-1", 4, []),
])
def test_visible_devices_map_to_nvml(value, count, expected):
    assert parse_visible_devices(value, count) == expected


def test_no_gpu_logs_one_line_and_records_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="workers.telemetry"):
        with GpuSampler("0") as sampler:
            time.sleep(0.05)
    assert not sampler.available
    assert sampler.samples.metrics() == {} and sampler.samples.series() == {}
    lines = [r for r in caplog.records if r.name == "workers.telemetry"]
    assert len(lines) == 1 and "GPU telemetry off" in lines[0].getMessage()
    assert gpu_identity("0") == {}


class FakeNvml:
    """NVML's API surface used by the sampler, for 8 GPUs with distinct readings."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        self.handles = {i: SimpleNamespace(index=i, uuid=f"GPU-{i:04d}") for i in range(8)}

    def nvmlDeviceGetCount(self):
        return 8

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.handles[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(h for h in self.handles.values() if h.uuid == uuid)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=10 * h.index, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=h.index * 2**30, total=141 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 100_000 + 1000 * h.index  # mW

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)


def test_samples_only_the_runs_gpus():
    with GpuSampler("GPU-0006,2", interval_s=0.01, nvml=FakeNvml()) as sampler:
        time.sleep(0.1)
    m = sampler.samples.metrics()
    assert sampler.available and m["gpu_samples"] >= 3
    assert m["gpu_util_mean"] == pytest.approx(40.0)  # mean of GPUs 6 and 2: (60 + 20) / 2
    assert m["gpu_mem_peak_gib"] == pytest.approx(8.0)  # 6 + 2 GiB
    assert m["gpu_power_w_mean"] == pytest.approx(208.0)  # 106 W + 102 W
    assert m["gpu_sm_clock_mhz_mean"] == 1980
    assert len(sampler.samples.series()["gpu_util"]) == m["gpu_samples"]
    assert gpu_identity("6,2", nvml=FakeNvml()) == {"gpu_name": "NVIDIA H200", "gpu_compute_capability": "sm_90",
                                                    "gpu_indices": "6,2"}
