"""The plugin preflight on a real local Ray (ray.cluster_utils.Cluster): two GPU nodes (logical GPUs), one whose
raylet environment hides specsweep from the interpreter (a `specsweep_kernels` package on PYTHONPATH that fails
to import) and sets SGLANG_PLUGINS to a list without ours. The check names that node and both causes, and leaves
the good node alone; servers that do not use the plugin check nothing."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.execution.plugin_preflight import CHECK_SCRIPT, PluginUnavailable, check_plugin_nodes, plugin_nodes
from orchestrator.execution.preflight import NodeInfo, Preflight
from orchestrator.config.settings import AcceleratorMatch, ClusterKind, ClusterSettings
from specsweep_common.spec import AttentionSpec, EngineKind, EngineSpec
from tools.testing import tiny_group, tiny_run, tiny_server
from tools.ray_testing import ray_cluster

ARCH = "sm_90"


def _group(attention: str = "specsweep_verify", version: str = "0.5.23"):
    server = dataclasses.replace(tiny_server(), engine=EngineSpec(kind=EngineKind.SGLANG, version=version,
                                                                  device="cuda"),
                                 attention=AttentionSpec(name=attention, backend=attention))
    return tiny_group(server, [tiny_run(server, 0)])


CLUSTER = ClusterSettings(kind=ClusterKind.RAY, address="auto", accelerator=ARCH)


def test_which_nodes_are_checked():
    nodes = (NodeInfo("a", "10.0.0.1", gpus=8, cpus=4, labels={"gpu-arch": ARCH}),
             NodeInfo("b", "10.0.0.2", gpus=8, cpus=4, labels={"gpu-arch": "sm_120"}),
             NodeInfo("head", "10.0.0.3", gpus=0, cpus=4))
    pre = Preflight(AcceleratorMatch.LABEL, nodes)
    assert plugin_nodes([_group()], CLUSTER, pre) == {"a": True}  # the node the server may land on
    assert plugin_nodes([_group(version="0.5.10")], CLUSTER, pre) == {"a": False}  # no entry points: the wrapper
    assert plugin_nodes([_group("triton")], CLUSTER, pre) == {}
    anywhere = dataclasses.replace(CLUSTER, accelerator=None)
    assert plugin_nodes([_group()], anywhere, pre) == {"a": True, "b": True}
    assert "entry_points(group='sglang.srt.plugins')" in CHECK_SCRIPT


def test_the_node_whose_sglang_interpreter_lacks_the_plugin_is_named(tmp_path):
    pytest.importorskip("ray")
    shadow = tmp_path / "shadow" / "specsweep_kernels"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("specsweep is not installed here")\n')
    node = dict(num_cpus=1, num_gpus=1, object_store_memory=80 * 2**20, labels={"gpu-arch": ARCH})
    bad_env = {"PYTHONPATH": str(shadow.parent), "SGLANG_PLUGINS": "someone_elses"}
    with ray_cluster([node, dict(node, env_vars=bad_env)]) as (_, (good, bad)):
        from orchestrator.execution.preflight import check_placement

        pre = check_placement([_group()], CLUSTER)
        assert len(plugin_nodes([_group()], CLUSTER, pre)) == 2
        check_plugin_nodes([_group("triton")], CLUSTER, pre)  # no plugin server: nothing to check, no error
        with pytest.raises(PluginUnavailable) as e:
            check_plugin_nodes([_group()], CLUSTER, pre)
    problems = e.value.problems
    assert len(problems) == 2 and all(p.startswith(f"node {bad.node_ip_address} ({bad.node_id[:12]}") for p in problems)
    assert any("cannot import specsweep_kernels.sglang_plugin (ImportError: specsweep is not installed here)" in p
               for p in problems)
    assert any("SGLANG_PLUGINS='someone_elses' leaves 'specsweep_verify' out" in p for p in problems)
    assert good.node_id[:12] not in str(e.value)
    assert "nothing was launched" in str(e.value) and "installed into the interpreter that runs SGLang" in str(e.value)
