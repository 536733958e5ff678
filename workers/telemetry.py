"""GPU telemetry for one run: an NVML sampler over the run's own GPUs only.

`GpuSampler(visible_devices)` samples utilisation, memory used, power and SM clock at ~10 Hz in a
daemon thread between `start()` and `stop()`, and returns per-run metrics (`gpu_util_mean`,
`gpu_mem_peak_gib`, `gpu_power_w_mean`, `gpu_sm_clock_mhz_mean`) and series. Without NVML or a GPU it
logs one line saying why and records nothing.

Index mapping: `CUDA_VISIBLE_DEVICES` entries are NVML indices (integers, with CUDA_DEVICE_ORDER=
PCI_BUS_ID, which is how Ray and schedulers assign them) or GPU UUIDs (`GPU-...`); both are mapped to
NVML handles, so a run on GPUs 4,5 of a node samples exactly those two.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType

log = logging.getLogger(__name__)

GIB = 2**30


class TelemetryUnavailable(RuntimeError):
    pass


def parse_visible_devices(value: str | None, device_count: int) -> list[int | str]:
    """CUDA_VISIBLE_DEVICES -> NVML indices (int) or UUID strings, in CUDA's order.

    None/unset means every device; an empty string means none. CUDA stops at the first invalid entry,
    and so do we.
    """
    if value is None:
        return list(range(device_count))
    out: list[int | str] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            break
        if item.startswith(("GPU-", "MIG-")):
            out.append(item)
            continue
        try:
            idx = int(item)
        except ValueError:
            break
        if idx < 0 or idx >= device_count:
            break
        out.append(idx)
    return out


def _load_nvml() -> ModuleType:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as e:
        raise TelemetryUnavailable("nvidia-ml-py is not installed (pip install 'specsweep[gpu]')") from e
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise TelemetryUnavailable(f"NVML could not start ({e}): no NVIDIA driver or GPU here") from e
    return pynvml


@dataclass
class Samples:
    util_pct: list[float] = field(default_factory=list)  # mean over the run's GPUs, per sample
    mem_used_gib: list[float] = field(default_factory=list)  # sum over the run's GPUs
    power_w: list[float] = field(default_factory=list)  # sum over the run's GPUs
    sm_clock_mhz: list[float] = field(default_factory=list)  # mean over the run's GPUs
    t_s: list[float] = field(default_factory=list)  # seconds since start

    def metrics(self) -> dict[str, float]:
        if not self.t_s:
            return {}
        return {"gpu_util_mean": statistics.fmean(self.util_pct),
                "gpu_mem_peak_gib": max(self.mem_used_gib),
                "gpu_power_w_mean": statistics.fmean(self.power_w),
                "gpu_sm_clock_mhz_mean": statistics.fmean(self.sm_clock_mhz),
                "gpu_samples": float(len(self.t_s))}

    def series(self) -> dict[str, list[float]]:
        if not self.t_s:
            return {}
        return {"gpu_util": self.util_pct, "gpu_mem_gib": self.mem_used_gib, "gpu_power_w": self.power_w}


class GpuSampler:
    """Context manager sampling the given GPUs; `.samples` holds the result after exit."""

    def __init__(self, visible_devices: str | None, interval_s: float = 0.1, nvml: ModuleType | None = None):
        self.visible_devices = visible_devices
        self.interval_s = interval_s
        self.samples = Samples()
        self.available = False
        self.reason = ""
        self._nvml = nvml
        self._handles: list = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuSampler:
        try:
            nvml = self._nvml or _load_nvml()
            ids = parse_visible_devices(self.visible_devices, nvml.nvmlDeviceGetCount())
            if not ids:
                raise TelemetryUnavailable(f"CUDA_VISIBLE_DEVICES={self.visible_devices!r} selects no GPU")
            self._handles = [nvml.nvmlDeviceGetHandleByUUID(i) if isinstance(i, str)
                             else nvml.nvmlDeviceGetHandleByIndex(i) for i in ids]
        except TelemetryUnavailable as e:
            self.reason = str(e)
            log.info("GPU telemetry off for this run: %s", e)
            return self
        self._nvml = nvml
        self.available = True
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Samples:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._sample()  # one last sample so even a short run has data
        return self.samples

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        nv = self._nvml
        if nv is None:
            raise RuntimeError("GpuSampler sampled before a successful start()")
        util, mem, power, clock = [], 0.0, 0.0, []
        for h in self._handles:
            util.append(float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            mem += nv.nvmlDeviceGetMemoryInfo(h).used / GIB
            power += nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
            clock.append(float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        s = self.samples
        s.util_pct.append(statistics.fmean(util))
        s.mem_used_gib.append(mem)
        s.power_w.append(power)
        s.sm_clock_mhz.append(statistics.fmean(clock))
        s.t_s.append(time.monotonic() - self._t0)


def gpu_identity(visible_devices: str | None, nvml: ModuleType | None = None) -> dict[str, str]:
    """Tags for a run: GPU names, and compute capability where NVML reports it; {} without GPUs."""
    try:
        nv = nvml or _load_nvml()
    except TelemetryUnavailable:
        return {}
    ids = parse_visible_devices(visible_devices, nv.nvmlDeviceGetCount())
    names, caps = [], []
    for i in ids:
        h = nv.nvmlDeviceGetHandleByUUID(i) if isinstance(i, str) else nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        names.append(name.decode() if isinstance(name, bytes) else str(name))
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        caps.append(f"sm_{major}{minor}")
    return {"gpu_name": ",".join(sorted(set(names))), "gpu_compute_capability": ",".join(sorted(set(caps))),
            "gpu_indices": ",".join(str(i) for i in ids)}

