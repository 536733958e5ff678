"""The plugin preflight: on every Ray node that could host an SGLang server with `attention=specsweep_verify`, can
the interpreter SGLang is started with load our plugin? Run once Ray is up, after the placement preflight, before
MLflow or any engine.

    plugin_nodes(groups, cluster, preflight) -> {node_id: needs the entry point}   the nodes to check
    check_plugin_nodes(groups, cluster, preflight, timeout_s=...) -> None          PluginUnavailable naming each node

Why per node: SGLang runs `load_plugins()` in every process it spawns, each scheduler / TP process among them
(`sglang/srt/managers/scheduler.py:6323`; also `managers/detokenizer_manager.py:552`,
`managers/data_parallel_controller.py:960`, `entrypoints/engine.py:286`), and finds our backend through the
`sglang.srt.plugins` entry point of the installed `specsweep` distribution (`sglang/srt/plugins/__init__.py:35-86`,
`entry_points(group=...)` then `ep.load()`). A node whose interpreter lacks specsweep (or its entry point) starts
SGLang without `specsweep_verify`: the server refuses the backend name at start-up, or, with SGLANG_PLUGINS set to a
list without it (`plugins/__init__.py:51-68`), never registers it. The interpreter is the one the server worker
starts SGLang with (`workers.sglang.argv.build_sglang_argv`: the worker's own `sys.executable`), so the check runs as a
Ray task pinned to each node (same runtime_env as the actors), which starts that interpreter on a short script.

What the script checks, in a fresh process as SGLang's launcher is: `sglang` is installed; `specsweep_kernels.
sglang_plugin` imports; the `workers.sglang.launch` wrapper our argv runs (`python -m workers.sglang.launch`) is
importable; and on SGLang versions with plugin entry points (`specsweep_common.sglang_facts`, 0.5.23) the entry point
`specsweep_verify` exists, loads our `register`, and SGLANG_PLUGINS (when set) does not leave it out.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Sequence

from orchestrator.execution.preflight import Preflight, PreflightError, describe_nodes
from orchestrator.config.settings import ClusterSettings
from specsweep_common.sglang_facts import SGLANG_PLUGIN_BACKENDS, SGLANG_VERSIONS
from specsweep_common.spec import ServerGroup, ServerSpec

logger = logging.getLogger(__name__)

CHECK_S = 120.0  # the interpreter imports torch with our plugin: seconds on a cold node
ENTRY_POINT_GROUP = "sglang.srt.plugins"  # sglang/srt/plugins/__init__.py:29
ENTRY_POINT = "specsweep_verify"

# Runs in SGLang's interpreter; argv[1] "entry-point": also check the entry point. Prints one JSON line.
CHECK_SCRIPT = r"""
import importlib.metadata, importlib.util, json, os, sys
problems = []
if importlib.util.find_spec("sglang") is None:
    problems.append("SGLang is not installed in it")
try:
    import specsweep_kernels.sglang_plugin as plugin
except Exception as e:
    plugin = None
    problems.append(f"it cannot import specsweep_kernels.sglang_plugin ({type(e).__name__}: {e})")
try:
    launcher = importlib.util.find_spec("workers.sglang.launch")
except Exception:
    launcher = None
if launcher is None:
    problems.append("it cannot find workers.sglang.launch (the wrapper `python -m workers.sglang.launch` starts SGLang)")
if sys.argv[1:] == ["entry-point"]:
    eps = [e for e in importlib.metadata.entry_points(group=%(group)r) if e.name == %(name)r]
    if not eps:
        problems.append("it has no %(group)r entry point %(name)r (the `specsweep` distribution is not installed)")
    elif plugin is not None and eps[0].load() is not plugin.register:
        problems.append(f"its entry point %(name)r loads {eps[0].value}, not specsweep_kernels.sglang_plugin:register")
    allowed = os.environ.get("SGLANG_PLUGINS")
    if allowed and %(name)r not in {x.strip() for x in allowed.split(",")}:
        problems.append(f"SGLANG_PLUGINS={allowed!r} leaves %(name)r out, so SGLang would not load it")
print(json.dumps({"python": sys.executable, "problems": problems}))
""" % {"group": ENTRY_POINT_GROUP, "name": ENTRY_POINT}


class PluginUnavailable(PreflightError):
    """Some node's SGLang interpreter cannot load the specsweep_verify plugin; nothing was launched."""

    def __init__(self, problems: Sequence[str], cluster_summary: str):
        super().__init__(problems, cluster_summary)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        self.args = (f"attention=specsweep_verify: SGLang's interpreter cannot load the plugin on {len(self.problems)} "
                     f"node(s); nothing was launched:\n{lines}\ncluster: {cluster_summary}\nallowed: specsweep "
                     "installed into the interpreter that runs SGLang on every GPU node (docs/sglang.md, "
                     "\"Deploying the plugin\")",)


def uses_plugin(server: ServerSpec) -> bool:
    a = server.attention
    return server.engine.kind.loads_kernel_plugin and any(
        b in SGLANG_PLUGIN_BACKENDS for b in (a.backend, a.decode_backend, a.prefill_backend))


def plugin_nodes(groups: Sequence[ServerGroup], cluster: ClusterSettings, preflight: Preflight) -> dict[str, bool]:
    """{node_id: whether the entry point is needed there} for every node that could host a plugin server."""
    out: dict[str, bool] = {}
    for g in groups:
        if not uses_plugin(g.server):
            continue
        facts = SGLANG_VERSIONS.get(g.server.engine.version)
        entry_point = bool(facts and facts.plugin_entry_points)
        needs = preflight.needs(g.server, cluster)
        for node in preflight.nodes:
            if needs.fits_on(node):
                out[node.node_id] = out.get(node.node_id, False) or entry_point
    return out


def node_check(entry_point: bool, timeout_s: float = CHECK_S) -> dict:
    """On the node (a Ray task): run CHECK_SCRIPT with this process's interpreter, the one SGLang is started with."""
    import socket

    out = {"host": socket.gethostname(), "python": sys.executable, "problems": []}
    try:
        proc = subprocess.run([sys.executable, "-c", CHECK_SCRIPT, *(["entry-point"] if entry_point else [])],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        out["problems"] = [f"the check did not finish: {type(e).__name__}: {e}"]
        return out
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        out["problems"] = [f"the check exited {proc.returncode}: {proc.stderr.strip()[-300:]}"]
        return out
    out.update(json.loads(lines[-1]))
    return out


def check_plugin_nodes(groups: Sequence[ServerGroup], cluster: ClusterSettings, preflight: Preflight, *,
                       timeout_s: float = CHECK_S) -> None:
    """Raise PluginUnavailable naming every node (address, id, host, interpreter) where SGLang's interpreter
    cannot load the plugin, or that did not answer within timeout_s + 60 s."""
    nodes = plugin_nodes(groups, cluster, preflight)
    if not nodes:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(node_check)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
        entry_point, timeout_s): node_id for node_id, entry_point in nodes.items()}
    done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s + 60)
    by_id = {n.node_id: n for n in preflight.nodes}
    problems = []
    for ref in done:
        node = by_id[refs[ref]]
        try:
            answer = ray.get(ref)
        except Exception as e:  # the task itself failed on that node
            answer = {"host": "?", "python": "?", "problems": [f"the check task failed: {type(e).__name__}: {e}"]}
        where = f"node {node.ip} ({node.node_id[:12]}, host {answer['host']}): {answer['python']}"
        problems += [f"{where}: {p}" for p in answer["problems"]]
    for ref in late:
        node = by_id[refs[ref]]
        ray.cancel(ref, force=True)
        problems.append(f"node {node.ip} ({node.node_id[:12]}): the check did not answer within {timeout_s + 60:g} s")
    logger.info("plugin preflight: %d node(s) checked, %d problem(s)", len(nodes), len(problems))
    if problems:
        raise PluginUnavailable(sorted(problems), describe_nodes(preflight.nodes, cluster))
