"""The worker side's short exception hierarchy. Every error maps to one `FailureReason` and carries the
engine's log tail, so the run that hit it becomes a FAILED record with the reason and the tail.

    WorkerError
    ├── EngineStartFailed       the process exited, or never became healthy, during start
    │   └── EngineTimeout       /health did not answer 200 within the startup timeout
    ├── EngineDied              the process exited after it was healthy (e.g. mid-probe)
    │   └── EngineHung          alive, but its health path unanswered for engine.health_timeout_s: killed
    ├── BadResponse             an HTTP error status, or a body missing required fields
    └── ProbeTimeout            a request ran past its timeout
"""

from __future__ import annotations

from specsweep_common.spec import FailureReason


class WorkerError(RuntimeError):
    reason: FailureReason = FailureReason.BAD_RESPONSE

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.message = message
        self.log_tail = log_tail

    def __str__(self) -> str:
        if not self.log_tail:
            return self.message
        return f"{self.message}\n--- engine log tail ---\n{self.log_tail}"

    def __reduce__(self):  # crosses Ray's process boundary intact
        return (type(self), (self.message, self.log_tail))


class EngineStartFailed(WorkerError):
    reason = FailureReason.ENGINE_START_FAILED


class EngineDied(WorkerError):
    reason = FailureReason.ENGINE_DIED


class EngineHung(EngineDied):
    """Killed by workers.health_watch: the run fails as engine_hung, the next run restarts the engine."""

    reason = FailureReason.ENGINE_HUNG


class EngineTimeout(EngineStartFailed):
    """Startup timeout. A subclass of EngineStartFailed: the group's runs fail as engine_start_failed."""


class BadResponse(WorkerError):
    reason = FailureReason.BAD_RESPONSE


class ProbeTimeout(WorkerError):
    reason = FailureReason.TIMEOUT
