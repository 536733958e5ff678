"""Test tiers from measured cost: `tests/tier_costs.json` from a JUnit XML of a full run.

    make test-all PYTEST_ARGS=--junitxml=/tmp/all.xml      # measure every test (setup + call + teardown)
    python -m tools.test_tiers /tmp/all.xml [--slow-over 2.0] [--note "2-core VM, load 0.1"]
    python -m tools.test_tiers --update /tmp/part.xml [...]   # a part of the suite re-measured; the rest kept

`tests/conftest.py` reads the table at collection: a test whose measured seconds exceed `slow_over_s`, or that sits
in one of the `slow_modules` (a module whose module-scoped fixture is the cost, as its first test shows: a Ray cluster, an engine, an MLflow
server, so that any one of its tests pays it), is marked `slow`; a test marked `smoke` stays in the fast tier
whatever it costs. `make test` runs `not slow`, `make test-slow` the rest, `make test-all` both. A test the table does
not know is fast until the next measurement. The table also prints the fast tier's measured total.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import logging
import xml.etree.ElementTree as ET
from pathlib import Path

log = logging.getLogger("tools.test_tiers")
TABLE = Path(__file__).resolve().parents[1] / "tests" / "tier_costs.json"
FIXTURE_SHARE = 0.5  # a module whose first test holds this share of its time pays a module-scoped fixture


def node_id(classname: str, name: str) -> str:
    return classname.replace(".", "/") + ".py::" + name


def measure(xml_path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for case in ET.parse(xml_path).iter("testcase"):
        if case.find("skipped") is None:
            out[node_id(case.get("classname", ""), case.get("name", ""))] = round(float(case.get("time", 0.0)), 2)
    return out


def slow_modules(costs: dict[str, float], slow_over: float) -> list[str]:
    """Modules with a module-scoped fixture whose first test (in run order) is over the line and carries most of
    the module's time: that first test is paying the fixture, which any of its tests would pay alone."""
    by_module: dict[str, list[float]] = collections.defaultdict(list)
    for nodeid, seconds in costs.items():  # run order (the XML's)
        by_module[nodeid.split("::")[0]].append(seconds)
    root = TABLE.parents[1]
    return sorted(m for m, times in by_module.items()
                  if len(times) > 1 and times[0] > slow_over and times[0] >= FIXTURE_SHARE * sum(times)
                  and (root / m).is_file() and 'scope="module"' in (root / m).read_text())


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m tools.test_tiers", description=__doc__.splitlines()[0])
    p.add_argument("junit_xml", type=Path, nargs="+")
    p.add_argument("--update", action="store_true",
                   help="keep the table's costs of the tests these XMLs do not measure (a part of the suite re-run)")
    p.add_argument("--slow-over", type=float, default=2.0)
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    earlier = json.loads(TABLE.read_text()) if args.update and TABLE.exists() else {"tests": {}, "slow_modules": []}
    costs: dict[str, float] = dict(earlier["tests"])
    measured: dict[str, float] = {}  # run order (the XMLs'), which slow_modules needs
    for xml_path in args.junit_xml:
        measured.update(measure(xml_path))
    costs.update(measured)
    # the table is sorted, not in run order: fixture-paying modules are found in what was measured now, and an
    # update keeps those the earlier table found in modules it did not re-measure
    remeasured = {n.split("::")[0] for n in measured}
    modules = sorted(set(slow_modules(measured, args.slow_over))
                     | {m for m in earlier["slow_modules"] if m not in remeasured})
    fast = {n: s for n, s in costs.items() if s <= args.slow_over and n.split("::")[0] not in modules}
    table = {"measured": f"{datetime.date.today()} {args.note}".strip(), "slow_over_s": args.slow_over,
             "slow_modules": modules, "tests": dict(sorted(costs.items()))}
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    log.info("%d tests measured, %.0f s in all; fast tier %d tests, %.0f s; slow modules: %s", len(costs),
             sum(costs.values()), len(fast), sum(fast.values()), ", ".join(modules) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
