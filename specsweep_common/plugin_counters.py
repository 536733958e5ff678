"""The specsweep_verify plugin's dispatch counters: what each name means, from the SGLang process to the run.

The plugin (kernels/specsweep_kernels/sglang_plugin.py) counts, in every SGLang scheduler / TP process, each
layer's attention call of the two phases it claims (TARGET_VERIFY and decode): on our kernel, or handed to
SGLang's Triton backend with a reason. The counts go into a prometheus_client Counter, `COUNTER` with labels
`LABELS`. Why that reaches the run: SGLang serves /metrics from a `MultiProcessCollector` over
PROMETHEUS_MULTIPROC_DIR (`sglang/srt/utils/common.py:2843-2853`), a directory the launcher creates and puts in
its environment before it spawns the schedulers (`sglang/srt/entrypoints/engine.py:1941-1942`,
`sglang/srt/utils/common.py:2825-2840`); prometheus_client picks its multi-process value class at import from
that variable, so a counter created in a scheduler is written to that directory and summed over processes (TP
ranks) on every /metrics read. The server worker scrapes /metrics before and after each run
(workers/sglang/plugin_counter_deltas.py) and records the deltas as the run's metrics `run_metrics` names.

Standard library only: the plugin, the workers and the diagnosis all read these names.
"""

from __future__ import annotations

from typing import Mapping

COUNTER = "specsweep_verify_attention_calls"  # prometheus_client appends `_total` to the counter sample
SAMPLE = COUNTER + "_total"
LABELS = ("phase", "path", "reason")
PHASES = ("verify", "decode")  # TARGET_VERIFY extend, decode
KERNEL, FALLBACK = "kernel", "fallback"  # label `path`

# label `reason` of a fallback (path=fallback): why that layer's call went to SGLang's Triton backend
FALLBACK_REASONS = {
    "no_k": "the layer passed no new K/V (it reads another layer's cache)",
    "mla": "an MLA layer (the plugin runs GQA/MHA layers only)",
    "head_dim": "a head dim the kernel does not take (K and V equal, a power of two in 16..256)",
    "tokens": "more tokens per request than the verify width the plugin was sized for (or than 64)",
    "extra_inputs": "attention sinks, a score mod or auxiliary tensors",
    "logit_cap": "a logit soft-cap",
    "sliding_window": "a sliding-window layer",
    "kv_scale": "fp8 KV-cache scales",
    "dcp": "decode context parallelism",
    "cross_attention": "a cross-attention layer",
    "replay_unrecorded": "a CUDA-graph replay of a phase for which no forward step was recorded at capture",
}

# run metrics (MLflow), deltas over one run, summed over the server's TP ranks, in layer calls
KERNEL_CALLS = "plugin_kernel_calls"
FALLBACK_CALLS = "plugin_fallback_calls"
KERNEL_CALLS_BY_PHASE = {p: f"plugin_{p}_kernel_calls" for p in PHASES}
FALLBACK_BY_REASON = "plugin_fallback_calls."  # + reason


def run_metrics(before: Mapping[tuple[str, str, str], float],
                after: Mapping[tuple[str, str, str], float]) -> dict[str, float]:
    """Run metrics from two reads of the counter, {(phase, path, reason): layer calls} each (a key absent
    before counts from 0): kernel calls in total and per phase, fallbacks in total and per reason."""
    out = {KERNEL_CALLS: 0.0, FALLBACK_CALLS: 0.0, **{name: 0.0 for name in KERNEL_CALLS_BY_PHASE.values()}}
    for key, value in after.items():
        phase, path, reason = key
        delta = value - before.get(key, 0.0)
        if delta <= 0:
            continue
        if path == KERNEL:
            out[KERNEL_CALLS] += delta
            if phase in KERNEL_CALLS_BY_PHASE:
                out[KERNEL_CALLS_BY_PHASE[phase]] += delta
        else:
            out[FALLBACK_CALLS] += delta
            name = FALLBACK_BY_REASON + (reason or "unknown")
            out[name] = out.get(name, 0.0) + delta
    return out


def unproven(metrics: Mapping[str, float]) -> str | None:
    """Why a run labelled specsweep_verify does not prove that only our kernel ran its verify / decode attention
    (None when it does): no counters recorded, no kernel call, or any fallback (with the reasons)."""
    kernel, fallback = metrics.get(KERNEL_CALLS), metrics.get(FALLBACK_CALLS)
    if kernel is None or fallback is None:
        return "no plugin counters were recorded (the /metrics read failed, or the plugin never built its backend)"
    reasons = sorted((k[len(FALLBACK_BY_REASON):], v) for k, v in metrics.items()
                     if k.startswith(FALLBACK_BY_REASON) and v > 0)
    if fallback > 0:
        return (f"{fallback:g} layer call(s) fell back to SGLang's Triton backend ("
                + ", ".join(f"{r}: {v:g}" for r, v in reasons) + ")")
    if kernel <= 0:
        return "the kernel was never called during the run"
    return None


__all__ = ["COUNTER", "FALLBACK", "FALLBACK_BY_REASON", "FALLBACK_CALLS", "FALLBACK_REASONS", "KERNEL",
           "KERNEL_CALLS", "KERNEL_CALLS_BY_PHASE", "LABELS", "PHASES", "SAMPLE", "run_metrics", "unproven"]
