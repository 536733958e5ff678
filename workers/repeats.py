"""A run's `probe.repeats` measurements combined into one: the mean and a 95 % interval per metric.

    combine(parts: [Measurement, ...]) -> (Measurement, tags)

Each part is one prompt of the point (workers/prompts.py: the same kind, a different text each), measured as one run
would be (its own /metrics counters, derived figures). The combined run records, for every metric:

- `<metric>`: the mean over the repeats (what every reader of the run sees, as before);
- with 2 or more repeats, the MLflow metrics `<metric>.ci95_lo`, `<metric>.ci95_hi` (Student's t over the repeats,
  specsweep_common/confidence_interval.py says why not a bootstrap) and `<metric>.n` (how many repeats measured it);
- the tag `<metric>.repeats`: the values, a JSON list in repeat order (what the regression check judges with).

Series, artifacts and the per-step histogram are repeat 0's (one prompt's steps, as before); notes carry their
repeat; engine time is the sum.
"""

from __future__ import annotations

import json
import statistics

from specsweep_common.confidence_interval import interval
from workers.measurement import Measurement

CI_SUFFIXES = (".ci95_lo", ".ci95_hi", ".n")
REPEATS_TAG = ".repeats"


def combine(parts: list[Measurement]) -> tuple[Measurement, dict[str, str]]:
    if not parts:
        raise ValueError("combine of no measurements")
    if len(parts) == 1:
        return parts[0], {}
    first = parts[0]
    out = Measurement(metrics={}, series=first.series, artifacts=first.artifacts, histogram=first.histogram,
                      drafts=first.drafts, engine_time_s=sum(p.engine_time_s for p in parts),
                      notes=[f"repeat {i}: {n}" for i, p in enumerate(parts) for n in p.notes])
    tags: dict[str, str] = {}
    names = list(dict.fromkeys(k for p in parts for k in p.metrics))  # first seen order
    for name in names:
        values = [p.metrics[name] for p in parts if name in p.metrics]
        out.metrics[name] = statistics.fmean(values)
        ci = interval(values)
        out.metrics.update({f"{name}.ci95_lo": ci.lo, f"{name}.ci95_hi": ci.hi, f"{name}.n": float(ci.n)})
        tags[name + REPEATS_TAG] = json.dumps(values)
        if len(values) < len(parts):
            out.notes.append(f"{name} measured on {len(values)} of {len(parts)} repeats")
    return out, tags
