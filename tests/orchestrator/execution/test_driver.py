"""The driver loop (orchestrator/execution/driver.py) as a unit.

Its bookkeeping without Ray (each such test checks that no Ray was started: `ray.kill` on a bare handle would start
a local one): the queue's order, and what a lost node does to the run in flight and to the rest of its group
(charged to that run's budget, `cluster.max_retries`, or to the group's while its engine was not up), on a slot
whose Ray handles were already released. On the session's Ray (tests/conftest.py): an interrupt turns every
unfinished or queued run KILLED, killing what actors it can (here none are left); and the loop itself with the real
reference engine: every run's result comes back, and `cluster.max_concurrent_servers=1` keeps the second server's
slot until the first one closed."""

from __future__ import annotations

import dataclasses
import time

import pytest

from orchestrator.config.settings import AcceleratorMatch, ClusterSettings, ExecutionSettings, TrackingSettings
from orchestrator.execution.driver import Driver, _Slot
from orchestrator.execution.preflight import Preflight
from orchestrator.execution.stats import ExecutionStats
from orchestrator.execution.progress import SweepProgress
from specsweep_common.spec import FailureReason, ProbeKind, RunResult, RunState
from tools.testing import tiny_group, tiny_run, tiny_server
from workers.runners import LOG_TAIL_ARTIFACT, EngineInfo, engine_log_path


def _settings(tmp_path, **cluster) -> ExecutionSettings:
    return ExecutionSettings(sweep_name="t", work_dir=str(tmp_path), progress=False, cluster=ClusterSettings(**cluster),
                             tracking=TrackingSettings(uri=f"sqlite:///{tmp_path}/mlflow.db"))


class _Driver:
    """A Driver with its emitted results and noted attempts kept in lists."""

    def __init__(self, tmp_path, preflight: Preflight | None = None, **cluster):
        self.emitted: list[RunResult] = []
        self.attempts: list[RunResult] = []
        self.stats = ExecutionStats()
        self.driver = Driver(_settings(tmp_path, **cluster), tmp_path, SweepProgress(1, enabled=False),
                             self.emitted.append, self.attempts.append, self.stats,
                             preflight or Preflight(AcceleratorMatch.AUTO, ()))


def _slot(group, attempt: int = 1, *, started: bool, engine: EngineInfo | None = None, closed: bool = True,
          bundle_nodes: tuple[str, ...] = ()) -> _Slot:
    """A slot whose runs are all unfinished; its placement group and actors already released (`closed`)."""
    return _Slot(group, attempt, pg=None, actor=None, followers=[],  # type: ignore[arg-type]
                 runs={object(): spec for spec in group.runs}, submitted_at=time.time(), started=started,
                 closed=closed, bundle_nodes=list(bundle_nodes), engine=engine,
                 engine_pid=str(engine.pid) if engine else "")


@pytest.fixture
def no_ray():
    ray = pytest.importorskip("ray")
    was = ray.is_initialized()
    yield
    assert ray.is_initialized() == was, "the unit started a Ray"


def test_the_queue_holds_the_longest_expected_work_first(tmp_path, no_ray):
    short, long_ = tiny_server("oracle"), tiny_server("ngram")
    g_short = tiny_group(short, [tiny_run(short, 0, context_len=64)])
    g_long = tiny_group(long_, [tiny_run(long_, 1, context_len=64), tiny_run(long_, 2, context_len=512)])
    tie = tiny_server("none")
    g_tie = tiny_group(tie, [tiny_run(tie, 3, context_len=64)])  # the same work as g_short: job order decides
    d = _Driver(tmp_path).driver
    d.enqueue([g_tie, g_short, g_long])
    assert [(g.group_id, runs, attempt) for g, runs, attempt in d.queue] == [
        (g_long.group_id, g_long.runs, 1), (g_short.group_id, g_short.runs, 1), (g_tie.group_id, g_tie.runs, 1)]


def test_a_lost_node_charges_the_run_in_flight_and_requeues_the_rest(tmp_path, no_ray):
    server = tiny_server("oracle")
    group = tiny_group(server, [tiny_run(server, i) for i in range(3)])
    engine_log_path(tmp_path, server).write_text("starting\nTraceback: the node went away\n")
    engine = EngineInfo(group.group_id, engine_starts=1, alive=True, pid=4242,
                        node={"node_id": "n1", "node_ip": "10.0.0.7"})
    t = _Driver(tmp_path, max_retries=1)
    d = t.driver

    d.lost(_slot(group, started=True, engine=engine), RuntimeError("actor died"))
    assert t.emitted == [] and len(t.attempts) == 1 and d.run_losses == {0: 1}
    attempt = t.attempts[0]
    assert attempt.run.job_index == 0 and attempt.state is RunState.FAILED
    assert attempt.reason is FailureReason.NODE_LOST and "loss 1 of this run" in attempt.message
    assert attempt.tags["retried"] == "true" and attempt.tags["attempt"] == "1"
    assert attempt.tags["node_id"] == "n1" and attempt.tags["node_ip"] == "10.0.0.7"
    assert attempt.tags["engine_pid"] == "4242"
    assert attempt.tags["engine_log"] == str(engine_log_path(tmp_path, server))
    assert "the node went away" in attempt.artifacts[LOG_TAIL_ARTIFACT]
    assert [(runs, n) for _, runs, n in d.queue] == [(group.runs, 2)]  # the whole group, on a fresh slot

    # the same run's node lost again: over its budget it ends FAILED, the others go back once more
    d.queue.clear()
    d.lost(_slot(group, 2, started=True, engine=engine), RuntimeError("actor died"))
    assert [r.run.job_index for r in t.emitted] == [0] and t.emitted[0].state is RunState.FAILED
    assert "retried" not in t.emitted[0].tags and "loss 2 of this run" in t.emitted[0].message
    assert [(runs, n) for _, runs, n in d.queue] == [(group.runs[1:], 3)]


def test_a_node_lost_before_the_engine_is_up_is_charged_to_the_group(tmp_path, no_ray):
    server = tiny_server("ngram")
    group = tiny_group(server, [tiny_run(server, 0), tiny_run(server, 1)])
    t = _Driver(tmp_path, max_retries=0)
    t.driver.lost(_slot(group, started=False, bundle_nodes=("n2",)), RuntimeError("placement group's node died"))
    assert t.attempts == [] and t.driver.queue == [] and t.driver.start_losses == {group.group_id: 1}
    assert [(r.run.job_index, r.state, r.reason) for r in t.emitted] == [
        (0, RunState.FAILED, FailureReason.NODE_LOST), (1, RunState.FAILED, FailureReason.NODE_LOST)]
    assert all("lost 1 times before its engine was up" in r.message for r in t.emitted)
    assert all(r.tags["node_id"] == "n2" for r in t.emitted)  # rank 0's bundle: its start never returned


def test_an_interrupt_kills_every_unfinished_and_queued_run(local_ray, tmp_path):
    running, queued = tiny_server("oracle"), tiny_server("ngram")
    g_running = tiny_group(running, [tiny_run(running, 2), tiny_run(running, 0)])
    g_queued = tiny_group(queued, [tiny_run(queued, 1)])
    t = _Driver(tmp_path)
    d = t.driver
    d.slots.append(_slot(g_running, started=True, closed=False))
    d.enqueue([g_queued])
    d.interrupt()
    assert [(r.run.job_index, r.state, r.reason) for r in t.emitted] == [
        (0, RunState.KILLED, FailureReason.INTERRUPTED), (2, RunState.KILLED, FailureReason.INTERRUPTED),
        (1, RunState.KILLED, FailureReason.INTERRUPTED)]
    assert d.queue == [] and d.refs == {} and all(not s.runs for s in d.slots)


def test_stop_all_on_error_kills_the_runs_and_reraises(tmp_path, no_ray):
    server = tiny_server("oracle")
    t = _Driver(tmp_path)
    t.driver.enqueue([tiny_group(server, [tiny_run(server, 0)])])
    with pytest.raises(KeyboardInterrupt), t.driver.stop_all_on_error():
        raise KeyboardInterrupt
    assert [(r.run.job_index, r.state) for r in t.emitted] == [(0, RunState.KILLED)]


@pytest.fixture
def local_ray(session_ray):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # left over from another module, with other settings
        ray.shutdown()
    ray.init(address=session_ray.address, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()  # disconnects; the session's Ray stays up


def test_the_loop_returns_every_result_one_server_at_a_time(local_ray, tmp_path):
    from orchestrator.execution.preflight import check_placement

    first, second = tiny_server("oracle", num_steps=3), tiny_server("none")
    g1 = tiny_group(first, [tiny_run(first, 0), tiny_run(first, 2, ProbeKind.NOVEL)])
    g2 = tiny_group(second, [tiny_run(second, 1)])
    settings = _settings(tmp_path, max_concurrent_servers=1)
    t = _Driver(tmp_path, check_placement([g1, g2], settings.cluster), max_concurrent_servers=1)
    t.driver.submit([g1, g2])
    assert len(t.driver.slots) == 1 and len(t.driver.queue) == 1  # the cap holds the second group back
    t.driver.loop()
    assert sorted(r.run.job_index for r in t.emitted) == [0, 1, 2] and t.attempts == []
    assert all(r.state is RunState.FINISHED for r in t.emitted), [r.message for r in t.emitted]
    assert [r.run.job_index for r in t.emitted if r.run.server == first] == [0, 2]  # a group's runs in job order
    slots = sorted(t.stats.slots, key=lambda s: s.submitted_at)
    assert [s.group_id for s in slots] == [g1.group_id, g2.group_id]  # g1's work (2 runs) is longer: first
    assert slots[1].submitted_at >= slots[0].ended_at  # submitted once the first slot's engine was stopped
    assert t.stats.engine_starts == {g1.group_id: 1, g2.group_id: 1}
    assert all(s.closed for s in t.driver.slots) and t.driver.refs == {}
    assert dataclasses.asdict(slots[0])["runs"] == 2
