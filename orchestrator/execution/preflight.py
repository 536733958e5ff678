"""Placement needs of each server, and the preflight: can this Ray cluster ever fit every ServerGroup?

Pure (no Ray):

    server_needs(server: ServerSpec, cluster: ClusterSettings, match=AcceleratorMatch.LABEL) -> ServerNeeds
        one bundle per node {GPU: tp_size / nnodes, CPU: cpus_per_server} (+ the accelerator resource on
        the fallback), STRICT_PACK on one node, STRICT_SPREAD over several, and the node label selector.
    resolve_match(cluster, nodes) -> AcceleratorMatch     auto: labels if any node carries the label key
    check_fit(groups, cluster, nodes) -> (AcceleratorMatch, [problem, ...])
    describe_nodes(nodes, cluster) -> "2× sm_120 (8 GPU), 1× sm_90 (8 GPU)"
    expected_work(group) -> float                         Σ (context_len + gen_tokens): the queue order

    check_declared(groups, cluster) -> [problem, ...]     what the config alone rules out (cluster.gpus_per_node,
                                                          tp_size over nnodes): a dry run's check with cluster=ray
    check_local(groups, gpus_found, source) -> [problem, ...]   cluster=local: servers that need more GPUs than
                                                          this machine has (Ray's logical GPUs do not count)

Edges, all before Ray and MLflow start: `check_local_placement(groups, cluster)` counts this machine's GPUs
(`local_gpus()`) and raises `PreflightError` (whether the tracking store answers is
`orchestrator.results.store_probe`'s). After Ray is up, `check_placement(groups, cluster) -> Preflight` reads `ray.nodes()` and raises
`PreflightError` naming every group that can never fit and what the cluster has, before MLflow and any engine.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, field
from typing import Sequence

from orchestrator.config.settings import AcceleratorMatch, ClusterSettings
from specsweep_common.spec import ServerGroup, ServerSpec

ACCELERATOR_RESOURCE_UNIT = 0.001  # per bundle, of a node's {"accelerator_sm_90": 1}: many bundles per node


class PreflightError(RuntimeError):
    """The cluster can never place some server; nothing was launched and nothing recorded."""

    def __init__(self, problems: Sequence[str], cluster_summary: str, where: str = "the Ray cluster"):
        self.problems = list(problems)
        self.cluster_summary = cluster_summary
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{where} can never fit {len(self.problems)} server(s); nothing was launched:\n"
                         f"{lines}\ncluster: {cluster_summary}")


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    gpus: float
    cpus: float
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    resources: dict[str, float] = field(default_factory=dict, hash=False)

    @classmethod
    def from_ray(cls, n: dict) -> "NodeInfo":
        res = n.get("Resources") or {}
        return cls(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", ""), gpus=res.get("GPU", 0.0),
                   cpus=res.get("CPU", 0.0), labels=dict(n.get("Labels") or {}), resources=dict(res))


@dataclass(frozen=True)
class ServerNeeds:
    nnodes: int
    gpus_per_node: int  # per bundle
    cpus_per_node: float
    accelerator: str | None = None
    match: AcceleratorMatch = AcceleratorMatch.LABEL
    label_key: str = "gpu-arch"

    @property
    def strategy(self) -> str:
        return "STRICT_PACK" if self.nnodes == 1 else "STRICT_SPREAD"

    @property
    def resource(self) -> str | None:
        return f"accelerator_{self.accelerator}" if self.accelerator else None

    def bundle(self) -> dict[str, float]:
        b: dict[str, float] = {"CPU": self.cpus_per_node}
        if self.gpus_per_node:
            b["GPU"] = float(self.gpus_per_node)
        resource = self.resource  # None exactly when there is no accelerator
        if resource is not None and self.match is AcceleratorMatch.RESOURCE:
            b[resource] = ACCELERATOR_RESOURCE_UNIT
        return b

    def bundles(self) -> list[dict[str, float]]:
        return [self.bundle() for _ in range(self.nnodes)]

    def label_selector(self) -> list[dict[str, str]] | None:
        if self.accelerator and self.match is AcceleratorMatch.LABEL:
            return [{self.label_key: self.accelerator} for _ in range(self.nnodes)]
        return None

    def describe(self) -> str:
        where = f", {self.label_key}={self.accelerator}" if self.accelerator else ""
        return f"{self.nnodes} node(s) × {{GPU: {self.gpus_per_node}, CPU: {self.cpus_per_node:g}}}{where}"

    def fits_on(self, node: NodeInfo) -> bool:
        """This node could host one bundle when it is empty."""
        return (node.gpus >= self.gpus_per_node and node.cpus >= self.cpus_per_node
                and self.matches(node))

    def matches(self, node: NodeInfo) -> bool:
        resource = self.resource  # None exactly when there is no accelerator
        if resource is None:
            return True
        if self.match is AcceleratorMatch.LABEL:
            return node.labels.get(self.label_key) == self.accelerator
        return node.resources.get(resource, 0.0) >= ACCELERATOR_RESOURCE_UNIT


def gpus_per_node(server: ServerSpec, cluster: ClusterSettings) -> int:
    """GPUs a server needs on each of its nodes."""
    if cluster.gpus_per_server:
        return cluster.gpus_per_server
    return math.ceil(server.tp_size / server.nnodes) if server.on_gpu else 0


def server_needs(server: ServerSpec, cluster: ClusterSettings,
                 match: AcceleratorMatch = AcceleratorMatch.LABEL) -> ServerNeeds:
    return ServerNeeds(nnodes=server.nnodes, gpus_per_node=gpus_per_node(server, cluster),
                       cpus_per_node=cluster.cpus_per_server, accelerator=cluster.accelerator,
                       match=AcceleratorMatch.LABEL if match is AcceleratorMatch.AUTO else match,
                       label_key=cluster.accelerator_label)


def expected_work(group: ServerGroup) -> float:
    """Queue order key (longest first): tokens the group's runs push through its engine."""
    return float(sum(r.probe.context_len + r.probe.gen_tokens for r in group.runs))


def resolve_match(cluster: ClusterSettings, nodes: Sequence[NodeInfo]) -> AcceleratorMatch:
    if cluster.accelerator_match is not AcceleratorMatch.AUTO:
        return cluster.accelerator_match
    if any(cluster.accelerator_label in n.labels for n in nodes):
        return AcceleratorMatch.LABEL
    if cluster.accelerator and any(cluster.accelerator_resource in n.resources for n in nodes):
        return AcceleratorMatch.RESOURCE
    return AcceleratorMatch.LABEL


def _arch(node: NodeInfo, cluster: ClusterSettings) -> str:
    if cluster.accelerator_label in node.labels:
        return node.labels[cluster.accelerator_label]
    archs = sorted(k[len("accelerator_"):] for k in node.resources if k.startswith("accelerator_"))
    return "/".join(archs) or "unlabelled"


def describe_nodes(nodes: Sequence[NodeInfo], cluster: ClusterSettings) -> str:
    counts = Counter((_arch(n, cluster), n.gpus) for n in nodes if n.gpus > 0)
    parts = [f"{c}× {arch} ({gpus:g} GPU)" for (arch, gpus), c in sorted(counts.items())]
    cpu_only = sum(1 for n in nodes if n.gpus <= 0)
    if cpu_only:
        parts.append(f"{cpu_only}× no GPU")
    return "nodes: " + (", ".join(parts) if parts else "none alive")


def _head(group: ServerGroup, needs: ServerNeeds) -> str:
    s = group.server
    return (f"group {group.group_id} ({len(group.runs)} run(s), engine={s.engine.kind.value}, tp_size={s.tp_size}, "
            f"nnodes={s.nnodes}, needs {needs.describe()})")


def _declared_problem(group: ServerGroup, needs: ServerNeeds, cluster: ClusterSettings) -> str | None:
    """What the cluster settings rule out for a validated server (what the config alone refuses, a tp_size that
    does not split over nnodes or an engine on one node only, was refused at validation: orchestrator/config/
    validate.py, workers/<engine>/rules.py)."""
    s, head = group.server, _head(group, needs)
    if cluster.gpus_per_node is not None and needs.gpus_per_node > cluster.gpus_per_node:
        return (f"{head}: {needs.gpus_per_node} GPUs per node but cluster.gpus_per_node={cluster.gpus_per_node}; "
                f"allowed: tp_size / nnodes <= {cluster.gpus_per_node}, e.g. "
                f"nnodes={math.ceil(s.tp_size / cluster.gpus_per_node)}")
    return None


def _group_problem(group: ServerGroup, needs: ServerNeeds, cluster: ClusterSettings,
                   nodes: Sequence[NodeInfo]) -> str | None:
    head = _head(group, needs)
    if declared := _declared_problem(group, needs, cluster):
        return declared
    matching = [n for n in nodes if needs.matches(n)]
    if needs.accelerator and not matching:
        what = "label" if needs.match is AcceleratorMatch.LABEL else f"resource {needs.resource}"
        return f"{head}: accelerator={needs.accelerator}: no node has that {what}"
    fitting = [n for n in matching if n.gpus >= needs.gpus_per_node and n.cpus >= needs.cpus_per_node]
    if len(fitting) < needs.nnodes:
        arch = f" with {needs.label_key}={needs.accelerator}" if needs.accelerator else ""
        return (f"{head}: {len(fitting) or 'no'} node(s){arch} with >= {needs.gpus_per_node} GPU(s) and "
                f">= {needs.cpus_per_node:g} CPU(s); it needs {needs.nnodes}")
    return None


def check_fit(groups: Sequence[ServerGroup], cluster: ClusterSettings,
              nodes: Sequence[NodeInfo]) -> tuple[AcceleratorMatch, list[str]]:
    match = resolve_match(cluster, nodes)
    problems = []
    for g in groups:
        p = _group_problem(g, server_needs(g.server, cluster, match), cluster, nodes)
        if p:
            problems.append(p)
    return match, problems


def check_declared(groups: Sequence[ServerGroup], cluster: ClusterSettings) -> list[str]:
    """What the configuration alone rules out, without asking Ray (a dry run with cluster=ray)."""
    return [p for g in groups if (p := _declared_problem(g, server_needs(g.server, cluster), cluster))]


def needs_real_gpus(server: ServerSpec) -> bool:
    """The stub engine only simulates a GPU server: Ray's logical GPUs are enough for it."""
    return server.on_gpu and not server.engine.kind.simulated


def check_local(groups: Sequence[ServerGroup], cluster: ClusterSettings, gpus_found: int, source: str) -> list[str]:
    """cluster=local is this one machine: a server spans one node and its GPUs must really be here."""
    out = []
    for g in groups:
        s, needs = g.server, server_needs(g.server, cluster)
        if s.nnodes > 1:
            out.append(f"{_head(g, needs)}: cluster=local is this one machine; allowed: nnodes=1, or cluster=ray "
                       f"with >= {s.nnodes} nodes")
        elif needs_real_gpus(s) and needs.gpus_per_node > gpus_found:
            allowed = f"tp_size <= {gpus_found}" if gpus_found else "engine.device=cpu or engine=stub"
            out.append(f"{_head(g, needs)}: tp_size={s.tp_size} needs {needs.gpus_per_node} GPU(s), this machine has "
                       f"{gpus_found} ({source}); allowed with cluster=local: {allowed}, or cluster=ray")
    return out


def local_gpus() -> tuple[int, str]:
    """GPUs really on this machine (never Ray's logical ones), and how they were counted. Without an NVIDIA or
    AMD GPU driver there are none, and torch (seconds to import) is not asked."""
    if not Path("/proc/driver/nvidia/gpus").is_dir() and not Path("/dev/kfd").exists():
        return 0, "no GPU driver: no /proc/driver/nvidia/gpus, no /dev/kfd"
    try:
        import torch
        gpu_torch = bool(torch.version.cuda or torch.version.hip)
    except ImportError:
        gpu_torch = False
    if gpu_torch:
        return torch.cuda.device_count(), "torch.cuda.device_count()"
    try:  # a CPU-only torch: what the NVIDIA driver lists
        found = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        found = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([d for d in visible.split(",") if d.strip()]))
    return found, "/proc/driver/nvidia/gpus" + (", CUDA_VISIBLE_DEVICES" if visible is not None else "")


def check_local_placement(groups: Sequence[ServerGroup], cluster: ClusterSettings) -> None:
    """cluster=local, before Ray starts: raise PreflightError naming every server this machine cannot run."""
    if not any(g.server.nnodes > 1 or needs_real_gpus(g.server) for g in groups):
        return
    found, source = local_gpus() if any(needs_real_gpus(g.server) for g in groups) else (0, "not counted")
    problems = check_local(groups, cluster, found, source)
    if problems:
        raise PreflightError(problems, f"this machine: {found} GPU(s) ({source})", where="this machine (cluster=local)")


@dataclass(frozen=True)
class Preflight:
    match: AcceleratorMatch
    nodes: tuple[NodeInfo, ...]

    def needs(self, server: ServerSpec, cluster: ClusterSettings) -> ServerNeeds:
        return server_needs(server, cluster, self.match)


def alive_nodes() -> list[NodeInfo]:
    import ray

    return [NodeInfo.from_ray(n) for n in ray.nodes() if n.get("Alive")]


def check_placement(groups: Sequence[ServerGroup], cluster: ClusterSettings) -> Preflight:
    """On a connected Ray: raise PreflightError unless every group could be placed on an empty cluster."""
    nodes = alive_nodes()
    match, problems = check_fit(groups, cluster, nodes)
    if problems:
        raise PreflightError(problems, describe_nodes(nodes, cluster))
    return Preflight(match, tuple(nodes))
