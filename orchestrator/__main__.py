"""The Hydra app: `specsweep [overrides]` or `python -m orchestrator [overrides]` (one run), `... +sweep=NAME` (a sweep).

A sweep goes through the `specsweep` launcher (hydra_plugins/specsweep_launcher), which plans and
executes every job at once; a single run calls the same core with one job. Before Hydra composes,
every override key is checked against the schema: a typo'd key exits 1 naming the closest valid keys
(Hydra would suggest `+key=...`, which the schema then refuses anyway).

Ctrl-C exits by SIGINT (130 in a shell) and SIGTERM 143, each with one line on stderr (no traceback). Both first stop every engine and
close the runs (orchestrator.execution.execute). A signal sent to the whole process group stops the Ray this driver
started as well; Ray is then abandoned (orchestrator.execution.ray_session) and the process ends with `os._exit`
once the runs are closed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Sequence

import hydra
from omegaconf import DictConfig

from orchestrator.config.schema import override_key_problems, register_configs
from orchestrator.config.problems import ConfigError
from orchestrator.execution.signals import interrupt_for
from specsweep_vocab.redact import RedactingStream, override_secrets

register_configs()


@hydra.main(config_path="pkg://conf", config_name="config", version_base="1.3")
def app(cfg: DictConfig) -> object:
    from hydra.core.hydra_config import HydraConfig

    from orchestrator.session.launcher import run_single

    hc = HydraConfig.get()
    return run_single(cfg, tuple(hc.overrides.task), dry_run=bool(hc.launcher.get("dry_run", False)))


def argv_overrides(argv: Sequence[str]) -> list[str]:
    """The overrides among Hydra's command-line arguments (its own argument parser)."""
    from hydra._internal.utils import get_args_parser

    try:
        args, _ = get_args_parser().parse_known_args(list(argv))
    except SystemExit:  # Hydra reports its own usage errors
        return []
    return list(args.overrides or [])


def main() -> None:
    """The `specsweep` console script (pyproject's [project.scripts]); reads `sys.argv` as Hydra does."""
    overrides = argv_overrides(sys.argv[1:])
    if problems := override_key_problems(overrides):
        sys.exit(str(ConfigError(problems)))
    # the one output boundary for secrets given on the command line (specsweep_vocab.redact.RedactingStream)
    secrets = override_secrets(overrides)
    sys.stdout, sys.stderr = RedactingStream(sys.stdout, secrets), RedactingStream(sys.stderr, secrets)
    # SIGTERM is an interrupt from the start (while Ray starts too), not only once the sweep runs (driver_signals)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        app()
    except KeyboardInterrupt as interrupt:  # cleaned up already (execution.execute): one line, not a traceback
        from orchestrator.execution.signals import Terminated

        term = isinstance(interrupt, Terminated)  # SIGTERM, cleaned up like Ctrl-C: exit 143, not as SIGINT
        print(f"specsweep: {'terminated (SIGTERM)' if term else 'interrupted (Ctrl-C)'}: what had started was "
              "stopped and its runs closed as KILLED; the same command resumes the rest", file=sys.stderr)
        if _ray_abandoned():  # Ray's GCS went with the signal: Ray's own exit would wait 60 s for it
            _exit_now(Terminated.exit_code if term else -signal.SIGINT)
        if term:
            sys.exit(Terminated.exit_code)
        sys.excepthook = _quiet_interrupt(sys.excepthook)
        raise  # Python then exits by SIGINT, as a shell expects of Ctrl-C (130)


def _ray_abandoned() -> bool:
    ray_session = sys.modules.get("orchestrator.execution.ray_session")
    return ray_session is not None and ray_session.ray_abandoned()


def _exit_now(code: int) -> None:
    """Exit without the interpreter's shutdown (Ray's atexit and its C++ threads): the MLflow runs are closed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:  # by the signal itself, as a shell expects of Ctrl-C
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise interrupt_for(signum)


def _quiet_interrupt(hook):
    """sys.excepthook without the traceback of a KeyboardInterrupt (already reported in one line)."""
    def excepthook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            hook(kind, value, tb)
    return excepthook


if __name__ == "__main__":
    main()
