"""The engine command lines a plan would start, checked before anything starts.

    engine_arg_problems(configs) -> [Problem]   per distinct server (cached by ServerSpec): extra_args that set a flag
                                                the orchestrator owns, and (engine=reference) argv its own parser refuses

Owned flags are derived, not listed: the flags of the argv the engine adapter builds for this server with no
extra_args at all, with the multi-node rank flags, plus `--host` and `--port` (`EngineAdapter.owned_flags`). `engine.extra_args=[--host,0.0.0.0]` would otherwise make the engine serve on every interface,
`[--context-length,N]` would break the context check, and a second `--speculative-num-steps` would silently win
over drafter.num_steps. An engine with a parser of its own to ask then reads the full argv
(`EngineAdapter.argv_problem`: the reference engine's argparse parser, `workers/reference/args.py build_parser`
with its cross-flag `resolve`), so an unknown or malformed flag is refused here with the parser's own words, not
when the engine exits 2 inside a Ray actor.
"""

from __future__ import annotations

from typing import Sequence

from orchestrator.config.plan import build_server
from specsweep_common.problem import Problem
from orchestrator.config.run_config import RunConfig
from specsweep_common.plan_point import argv_flags
from specsweep_common.spec import JobKind, ServerSpec
from workers.registry import adapter_for


def owned_flags(server: ServerSpec) -> frozenset[str]:
    return adapter_for(server.engine.kind).owned_flags(server)


def _server_problems(server: ServerSpec, stub_extra: int) -> list[tuple[str, object, str]]:
    out: list[tuple[str, object, str]] = []
    owned = owned_flags(server)
    # the adapter's server_engine may put the engine's own flags first (the stub's timing): those are not the user's
    user_engine = server.engine.extra_args[stub_extra:]
    for key, args in (("engine.extra_args", user_engine), ("drafter.extra_args", server.drafter.extra_args)):
        for flag in sorted(argv_flags(args) & owned):
            out.append((key, flag, f"no flag the orchestrator sets itself (it builds {flag} from the config; "
                        f"owned for this server: {', '.join(sorted(owned))})"))
    if not out and (server.engine.extra_args or server.drafter.extra_args) \
            and (allowed := adapter_for(server.engine.kind).argv_problem(server)):
        key = "drafter.extra_args" if server.drafter.extra_args and not server.engine.extra_args \
            else "engine.extra_args"
        out.append((key, list(server.engine.extra_args or server.drafter.extra_args), allowed))
    return out


def engine_arg_problems(configs: Sequence[RunConfig]) -> list[Problem]:
    cache: dict[ServerSpec, list[tuple[str, object, str]]] = {}
    out: list[Problem] = []
    for rc in configs:
        if rc.job is not JobKind.ENGINE or not (rc.engine.extra_args or rc.drafter.extra_args):
            continue
        server = build_server(rc)
        if server not in cache:
            cache[server] = _server_problems(server, len(server.engine.extra_args) - len(rc.engine.extra_args))
        out += [Problem(key, value, allowed, rc.overrides) for key, value, allowed in cache[server]]
    return out


