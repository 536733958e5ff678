"""The checks before Ray or MLflow start: the declared cluster and this machine's real GPUs (the tracking store:
tests/orchestrator/results/test_store_probe.py)."""

from __future__ import annotations

import dataclasses


from orchestrator.execution.preflight import check_declared, check_local
from orchestrator.config.settings import ClusterKind, ClusterSettings
from specsweep_common.spec import EngineKind
from tools.testing import stub_server, tiny_group, tiny_run, tiny_server


def _group(server):
    return tiny_group(server, [tiny_run(server, 0)])


def _sglang(tp_size: int, nnodes: int = 1):
    ref = tiny_server()
    engine = dataclasses.replace(ref.engine, kind=EngineKind.SGLANG, version="0.5.23", device="cuda")
    return dataclasses.replace(ref, engine=engine, tp_size=tp_size, nnodes=nnodes)


def test_local_counts_real_gpus_not_logical_ones():
    sglang = _sglang(4)
    local = ClusterSettings(kind=ClusterKind.LOCAL, num_gpus=8)  # Ray would advertise 8 logical GPUs
    (p,) = check_local([_group(sglang)], local, 2, "torch.cuda.device_count()")
    assert "tp_size=4 needs 4 GPU(s), this machine has 2 (torch.cuda.device_count())" in p
    assert "allowed with cluster=local: tp_size <= 2" in p
    assert check_local([_group(sglang)], local, 4, "x") == []
    assert check_local([_group(tiny_server())], local, 0, "x") == []  # the reference engine on CPU
    stub = stub_server(tp_size=16)  # a simulation: Ray's logical GPUs are enough
    assert check_local([_group(stub)], local, 0, "x") == []
    (p,) = check_local([_group(stub_server(tp_size=2, nnodes=2))], local, 0, "x")
    assert "cluster=local is this one machine; allowed: nnodes=1" in p


def test_declared_gpus_per_node():
    sglang = _sglang(16)
    ray = ClusterSettings(kind=ClusterKind.RAY, address="auto", gpus_per_node=8)
    (p,) = check_declared([_group(sglang)], ray)
    assert "tp_size=16" in p and "cluster.gpus_per_node=8" in p and "allowed: tp_size / nnodes <= 8" in p
    assert check_declared([_group(_sglang(16, 2))], ray) == []
