"""The specsweep_verify plugin's dispatch counters on a run: read from SGLang's /metrics before and after it.

    dispatch_counts(text) -> {(phase, path, reason): layer calls}   the plugin's counter in a /metrics text
    read_dispatch(base_url) -> counts | None                         GET /metrics; None when it cannot be read
    record_dispatch(base_url, before, metrics) -> [note, ...]        after a run: the deltas into `metrics`

What the counter is and why SGLang's /metrics carries it from the scheduler processes:
`specsweep_common.plugin_counters`. The deltas are summed over the server's TP ranks (each rank runs its layers)
and count layer calls, CUDA-graph replays included. A run whose /metrics cannot be read gets no plugin metrics
and a note; the diagnosis then reports it as unproven.
"""

from __future__ import annotations

import logging
import math

from prometheus_client.parser import text_string_to_metric_families

from specsweep_common import plugin_counters as pc
from workers.engine_counters import read_metrics

logger = logging.getLogger(__name__)

Counts = dict[tuple[str, str, str], float]


def dispatch_counts(text: str) -> Counts:
    """The plugin counter's samples of a Prometheus text, by their (phase, path, reason) labels (summed where the
    exposition repeats a label set). ValueError for a text the Prometheus parser refuses."""
    out: Counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != pc.SAMPLE or math.isnan(sample.value):
                continue
            phase, path, reason = (sample.labels.get(label, "") for label in pc.LABELS)
            out[(phase, path, reason)] = out.get((phase, path, reason), 0.0) + float(sample.value)
    return out


def read_dispatch(base_url: str) -> Counts | None:
    return read_metrics(base_url, dispatch_counts, "the plugin counters")


def record_dispatch(base_url: str, before: Counts | None, metrics: dict[str, float]) -> list[str]:
    """After a run: the plugin's kernel / fallback layer calls during it into `metrics`
    (`specsweep_common.plugin_counters.run_metrics`); notes for what could not be read or what fell back."""
    after = read_dispatch(base_url)
    if before is None or after is None:
        return ["specsweep_verify counters not recorded: /metrics could not be read"]
    if not after:
        return [f"specsweep_verify counters not recorded: /metrics has no {pc.SAMPLE} (the plugin built no "
                "backend in any scheduler process, or SGLang's metrics are off)"]
    metrics.update(pc.run_metrics(before, after))
    why = pc.unproven(metrics)
    return [f"specsweep_verify: {why}"] if why else []
