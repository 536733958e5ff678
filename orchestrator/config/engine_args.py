"""The engine command lines a plan would start, checked before anything starts.

    engine_arg_problems(configs) -> [Problem]   per distinct server (cached by ServerSpec): extra_args that set a flag
                                                the orchestrator owns, and (engine=reference) argv its own parser refuses

Owned flags are derived, not listed: the flags of the argv the engine adapter builds for this server with no
extra_args at all (workers/engine.py `build_engine_argv`), with the multi-node rank flags, plus `--host` and
`--port`. `engine.extra_args=[--host,0.0.0.0]` would otherwise make the engine serve on every interface,
`[--context-length,N]` would break the context check, and a second `--speculative-num-steps` would silently win
over drafter.num_steps. The reference engine's own argparse parser (`workers/reference/args.py build_parser`,
with its cross-flag `resolve`) then reads the full argv, so an unknown or malformed flag is refused here with the
parser's own words, not when the engine exits 2 inside a Ray actor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from orchestrator.config.plan import build_server
from orchestrator.config.problems import Problem
from orchestrator.config.run_config import RunConfig
from specsweep_vocab.spec import EngineKind, JobKind, ServerSpec

ALWAYS_OWNED = ("--host", "--port")
PORT = 30000  # any: the argv's shape does not depend on it


def _flags(argv: Sequence[str]) -> dict[str, int]:
    """`--flag` (or `--flag=value`) -> its index in argv."""
    return {a.split("=", 1)[0]: i for i, a in enumerate(argv) if a.startswith("--")}


def owned_flags(server: ServerSpec) -> frozenset[str]:
    from workers.engine import NodeRank, build_engine_argv

    bare = replace(server, engine=replace(server.engine, extra_args=()),
                   drafter=replace(server.drafter, extra_args=()))
    node_rank = NodeRank(0, server.nnodes, "127.0.0.1:1") if server.nnodes > 1 else None
    return frozenset(_flags(build_engine_argv(bare, PORT, node_rank))) | frozenset(ALWAYS_OWNED)


class _Refused(Exception):
    pass


def reference_parser_problem(argv: Sequence[str]) -> str | None:
    """What the reference engine's parser says about argv (its flags after `python -m workers.reference`)."""
    from workers.reference.args import build_parser, resolve

    parser = build_parser()

    def error(message: str):  # argparse's error() exits; here it is a value
        raise _Refused(message)

    parser.error = error  # type: ignore[method-assign]
    try:
        resolve(parser.parse_args(list(argv)), parser)
    except _Refused as e:
        return str(e)
    return None


def _server_problems(server: ServerSpec, stub_extra: int) -> list[tuple[str, object, str]]:
    from workers.engine import build_engine_argv

    out: list[tuple[str, object, str]] = []
    owned = owned_flags(server)
    # with_stub_flags put the stub's own timing flags first: those are engine.stub.*, not the user's
    user_engine = server.engine.extra_args[stub_extra:]
    for key, args in (("engine.extra_args", user_engine), ("drafter.extra_args", server.drafter.extra_args)):
        for flag in sorted(set(_flags(args)) & owned):
            out.append((key, flag, f"no flag the orchestrator sets itself (it builds {flag} from the config; "
                        f"owned for this server: {', '.join(sorted(owned))})"))
    if server.engine.kind is EngineKind.REFERENCE and not out \
            and (server.engine.extra_args or server.drafter.extra_args):
        argv = build_engine_argv(server, PORT)
        start = argv.index("workers.reference") + 1
        if why := reference_parser_problem(argv[start:]):
            key = "drafter.extra_args" if server.drafter.extra_args and not server.engine.extra_args \
                else "engine.extra_args"
            out.append((key, list(server.engine.extra_args or server.drafter.extra_args),
                        f"flags the reference engine accepts (its parser, workers/reference/args.py: {why})"))
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


