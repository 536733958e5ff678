"""Every resource opened before Ray starts, each failure one line naming the key (35 of 46 bad inputs tried on
2026-12-02 started Ray before any refusal): the working directory, cluster.address, the probe file (the tracking
store: tests/orchestrator/results/test_store_probe.py)."""

from __future__ import annotations

import os
import socket
import time

import pytest
from hydra import compose, initialize_config_module

from orchestrator.config.schema import register_configs, to_run_config
from orchestrator.config.config_error import ConfigError
from orchestrator.execution.resources import ray_address_problem, work_dir_problem


def test_work_dir_writable_with_room(tmp_path):
    assert work_dir_problem(str(tmp_path), 10) is None
    assert "does not exist" in work_dir_problem(str(tmp_path / "nope"), 1)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if not os.access(ro, os.W_OK):  # root writes anyway
            assert "not writable" in work_dir_problem(str(ro), 1)
    finally:
        ro.chmod(0o700)
    why = work_dir_problem(str(tmp_path), 10 ** 9)  # 2 PiB of logs
    assert why is not None and "the sweep needs about" in why and "MiB free" in why


def test_ray_address_reached_with_a_short_deadline():
    assert ray_address_problem("auto") is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    why = ray_address_problem(f"127.0.0.1:{port}", budget_s=1.0)
    assert why is not None and why.startswith(f"cluster.address='127.0.0.1:{port}' does not answer")
    assert time.monotonic() - t0 < 5


def test_probe_file_regular_and_no_larger_than_the_context_needs(tmp_path):
    register_configs()
    with initialize_config_module("conf", version_base="1.3"):
        def problem(path: str) -> str:
            cfg = compose("config", overrides=["probe=file", f"probe.path={path}"])
            with pytest.raises(ConfigError) as e:
                to_run_config(cfg, (), cwd=str(tmp_path))
            (p,) = e.value.problems
            assert p.key == "probe.path"
            return p.allowed

        (tmp_path / "big.txt").write_bytes(b"word " * 2 ** 20)  # 5 MiB; smollm2-135m takes 8192 tokens
        assert "a file of at most 1048576 bytes" in problem("big.txt")
        (tmp_path / "d").mkdir()
        assert "an existing regular file" in problem("d")
        assert "an existing regular file" in problem("/dev/zero")  # never read
