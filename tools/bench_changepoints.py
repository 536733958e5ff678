"""Which change-point library finds steps in a nightly history: ruptures (PELT, binary segmentation) against
MongoDB's E-divisive means (`signal-processing-algorithms`), on synthetic histories with a known step.

    python -m tools.bench_changepoints [--series 200] [--length 30]

Each history: `length` nightly values, Gaussian noise sd 1, one step of `size` sd at a random night in the middle
third (or none: the false-alarm rows). Detected: a change point within 1 night of the step. A library that is not
installed is reported as such (signal-processing-algorithms pins numpy < 2: run it from its own virtualenv).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time


def _series(rng: random.Random, length: int, size: float) -> tuple[list[float], int | None]:
    at = rng.randrange(length // 3, 2 * length // 3) if size else None
    return [rng.gauss(0, 1) + (size if at is not None and i >= at else 0.0) for i in range(length)], at


def _ours(values):
    from orchestrator.results.regress.changepoints import change_points

    return change_points(values)


def _binseg(values):
    import numpy as np
    import ruptures as rpt

    from orchestrator.results.regress.changepoints import noise_sigma

    s = np.asarray(values) / noise_sigma(values)
    return rpt.Binseg(model="l2", min_size=2, jump=1).fit(s.reshape(-1, 1)).predict(pen=3 * math.log(len(s)))[:-1]


def _edivisive(values):
    from signal_processing_algorithms.energy_statistics.energy_statistics import e_divisive

    return list(e_divisive(values, pvalue=0.05, permutations=100))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=200)
    ap.add_argument("--length", type=int, default=30)
    args = ap.parse_args()
    methods = {"ruptures PELT l2 (chosen)": _ours, "ruptures Binseg l2": _binseg,
               "E-divisive (signal-processing-algorithms)": _edivisive}
    print("| method | false alarms / null history | detected 2 sd | detected 3 sd | detected 5 sd | ms / history |")
    print("|---|---|---|---|---|---|")
    for name, fn in methods.items():
        try:
            fn([0.0, 1.0, 0.5, 0.2, 0.3])
        except ImportError as e:
            print(f"| {name} | not installed here ({e.name}) | | | | |")
            continue
        rng = random.Random(0)
        row, times = [], []
        for size in (0.0, 2.0, 3.0, 5.0):
            hits = 0
            for _ in range(args.series):
                values, at = _series(rng, args.length, size)
                t = time.perf_counter()
                cps = fn(values)
                times.append(time.perf_counter() - t)
                hits += len(cps) if at is None else any(abs(c - at) <= 1 for c in cps)
            row.append(f"{hits / args.series:.2f}" if size == 0 else f"{hits / args.series:.0%}")
        print(f"| {name} | " + " | ".join(row) + f" | {statistics.median(times) * 1000:.2f} |")


if __name__ == "__main__":
    main()
