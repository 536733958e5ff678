"""The stub engine's plan-time rules, behind `StubAdapter.plan_problems`.

    stub_problems(point) -> [Problem]   timing is set through `engine.stub.*`, not smuggled into `engine.extra_args`

The stub takes its timing as `--stub-*` flags (workers/stub/server.py), which the plan prepends to extra_args from
`engine.stub` (`StubAdapter.server_engine`, through orchestrator/config/plan.py `server_engine`); the timings' ranges are their declared domains
(specsweep_common/spec.py StubOptions).
"""

from __future__ import annotations

from specsweep_common.plan_point import PlanPoint, argv_flags
from specsweep_common.problem import Problem
from specsweep_common.spec import STUB_FLAGS

# each --stub-* flag's engine.stub key, in StubOptions field order
STUB_KEYS = dict(zip(STUB_FLAGS, ("token_s", "prefill_s", "startup_s", "rendezvous_timeout_s")))


def stub_problems(point: PlanPoint) -> list[Problem]:
    return [Problem("engine.extra_args", flag, f"engine.stub.{STUB_KEYS[flag]}=N instead (engine=stub emits "
                    f"{flag} from it)", point.overrides)
            for flag in sorted(argv_flags(point.engine.extra_args) & set(STUB_FLAGS))]
