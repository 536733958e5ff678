"""Moved to `orchestrator.testing` (issue 16: test helpers out of runtime packages). This re-export keeps
branches written before the move importing; delete it once none imports `workers.testing`."""

from orchestrator.testing import TINY, pid_alive, stub_server, tiny_drafter, tiny_group, tiny_run, tiny_server

__all__ = ["TINY", "pid_alive", "stub_server", "tiny_drafter", "tiny_group", "tiny_run", "tiny_server"]
