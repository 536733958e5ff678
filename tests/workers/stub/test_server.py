"""The stub engine's timing: `engine.stub.*` (StubOptions) -> `--stub-*` flags -> the stub's own parser."""

from __future__ import annotations

import os

from orchestrator.config.jobs import plan_jobs
from specsweep_common.spec import STUB_FLAGS, StubOptions
from tools.testing import engines_under, pid_alive, proc_env, stub_server, stub_starts
from workers.engine_process import EngineProcess
from workers.registry import build_engine_argv
from workers.stub.server import parse_args


def test_stub_options_round_trip_through_the_stub_parser():
    opts = StubOptions(token_s=0.0125, prefill_s=2e-4, startup_s=0.0, rendezvous_timeout_s=30)
    args = parse_args(list(opts.argv()))
    assert (args.stub_token_s, args.stub_prefill_s, args.stub_startup_s, args.stub_rendezvous_timeout_s) == \
        (0.0125, 2e-4, 0.0, 30.0)
    assert list(opts.argv()[::2]) == list(STUB_FLAGS)


def test_conf_engine_stub_reaches_the_engine_argv(tmp_path):
    plan, _ = plan_jobs([["engine=stub", "engine.stub.token_s=0.02", "engine.stub.prefill_s=0.001"]], sweep=False,
                        cwd=str(tmp_path))
    (run,) = plan.runs
    argv = build_engine_argv(run.server, 31234)
    assert argv[1:3] == ["-m", "workers.stub.server"]
    args = parse_args(argv[3:])
    assert (args.stub_token_s, args.stub_prefill_s, args.stub_startup_s) == (0.02, 0.001, 0.2)
    assert args.speculative_algorithm == "NGRAM" and args.speculative_num_steps == 4  # the default drafter: ngram
    # the timing is part of the server's identity: another token time is another server and another run_hash
    other, _ = plan_jobs([["engine=stub", "engine.stub.token_s=0.03", "engine.stub.prefill_s=0.001"]], sweep=False,
                         cwd=str(tmp_path))
    assert other.runs[0].server.key != run.server.key and other.runs[0].run_hash != run.run_hash


def test_stub_server_extra_args_come_after_the_timing():
    server = stub_server(token_s=0.5, extra_args=("--stub-startup-s", "not-a-number"))
    assert server.engine.stub == StubOptions(token_s=0.5)
    extra = server.engine.extra_args
    assert extra[:len(StubOptions().argv())] == StubOptions(token_s=0.5).argv()
    assert extra[-2:] == ("--stub-startup-s", "not-a-number")  # argparse keeps the last: tests can break a start


def test_start_up_line_names_the_process_and_no_other_env_value(tmp_path):
    """The stub logs where it runs (as SGLang logs its server args); tests read that, never a secret, from the log."""
    secret = "stubenv-9Kd2Qx"
    server = stub_server(tp_size=2, token_s=0.0, startup_s=0.0)
    env = {"CUDA_VISIBLE_DEVICES": "3,5", "SPECSWEEP_NODE_ID": "node-a", "SPECSWEEP_TEST_SECRET": secret}
    with EngineProcess.for_server(server, tmp_path / "engine-x.log", env=env) as engine:
        assert engines_under(os.getpid()) == {engine.pid: engine.base_url}
        assert proc_env(engine.pid)["SPECSWEEP_TEST_SECRET"] == secret
        pid = engine.pid
    assert not pid_alive(pid)
    (start,) = stub_starts(tmp_path)
    assert (start.pid, start.node_rank, start.nnodes, start.tp_size, start.dist_init_addr) == (pid, 0, 1, 2, "None")
    assert (start.cuda_visible_devices, start.node_id) == ("3,5", "node-a")
    assert start.argv[1:3] == ("-m", "workers.stub.server") and start.argv[start.argv.index("--port") + 1] == \
        engine.base_url.rsplit(":", 1)[1]
    assert secret not in (tmp_path / "engine-x.log").read_text()
