"""The checks before Ray or MLflow start: the declared cluster, this machine's real GPUs, the tracking store."""

from __future__ import annotations

import dataclasses
import socket
import time


from orchestrator.execution.preflight import check_declared, check_local, probe_tracking
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


def test_probe_tracking_refused_and_silent():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "Connection refused" in probe_tracking(f"http://127.0.0.1:{port}")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        t0 = time.monotonic()
        why = probe_tracking(f"http://127.0.0.1:{listener.getsockname()[1]}", budget_s=1.0)
        assert time.monotonic() - t0 < 3 and ("timed out" in why or "no answer within 1 s" in why)


def test_probe_tracking_sqlite(tmp_path):
    assert probe_tracking(f"sqlite:///{tmp_path}/mlflow.db") is None
    assert "does not exist" in probe_tracking(f"sqlite:///{tmp_path}/nope/mlflow.db")


def test_probe_tracking_answers_for_a_real_mlflow_server(tmp_path, mlflow_ui):
    with mlflow_ui(f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "artifacts") as url:
        assert probe_tracking(url) is None
    assert "Connection refused" in probe_tracking(url)
