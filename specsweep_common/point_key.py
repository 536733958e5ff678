"""A grid point's identity across runs of it: `point_key`.

`run_hash` (`stable_hash(server, probe)`, orchestrator/config/plan.py `build_run`) names exactly what was run. Between
two runs of the same point some things may change without making it another point: the project's git sha and the
node are never in run_hash; the engine version is (`EngineSpec.version`), and so is the server's bind host. `point_key`
is run_hash without those, so a point keeps its history across an engine upgrade (the upgrade is then what the
regression report attributes a change to, from the `engine_version` tag).

`lossless_key` is point_key without the drafter: a speculative run and the run of the same point without
speculation (drafter=none) share it, and at temperature 0 their greedy outputs must be equal (the diagnosis'
lossless check, orchestrator/results/diagnosis.py).
"""

from __future__ import annotations

import dataclasses

from specsweep_common.spec import DrafterSpec, ProbeSpec, ServerSpec, stable_hash

# What may change between runs of one point (ServerSpec fields set to a constant before hashing).
NOT_POINT_IDENTITY = ("engine.version", "host")


def point_key(server: ServerSpec, probe: ProbeSpec) -> str:
    """`stable_hash` of (server, probe) with the engine version and the bind host blanked: equal for every run of one
    grid point, whichever build of the engine or node ran it."""
    neutral = dataclasses.replace(server, engine=dataclasses.replace(server.engine, version=""), host="")
    return stable_hash("point", neutral, probe)[:16]


def lossless_key(server: ServerSpec, probe: ProbeSpec) -> str:
    """point_key with the drafter (and the attention backend only a draft uses) blanked: equal for a speculative run
    and the drafter=none run of the same model, dtype, engine, attention, page size, seed, context and probe."""
    neutral = dataclasses.replace(server, engine=dataclasses.replace(server.engine, version=""), host="",
                                  drafter=DrafterSpec(name=""),
                                  attention=dataclasses.replace(server.attention, draft_backend=None))
    return stable_hash("lossless", neutral, probe)[:16]
