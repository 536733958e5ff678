"""The Hydra app: `specsweep [overrides]` or `python -m orchestrator [overrides]` (one run), `... +sweep=NAME` (a sweep).

A sweep goes through the `specsweep` launcher (hydra_plugins/specsweep_launcher), which plans and
executes every job at once; a single run calls the same core with one job. Before Hydra composes,
every override key is checked against the schema: a typo'd key exits 1 naming the closest valid keys
(Hydra would suggest `+key=...`, which the schema then refuses anyway).

One way out for every refusal: a refusal (`hydra.errors.CompactHydraException`: an invalid config, a cluster that
cannot fit, an unusable working directory, ...) and an error Hydra or OmegaConf raise while composing (an override
they cannot apply, named as a problem with its key and value) print one message and exit 1, with no traceback and
no hint of one: Hydra runs the app with HYDRA_FULL_ERROR set, so that its errors reach `main` instead of Hydra's
own report (which appends "Set the environment variable HYDRA_FULL_ERROR=1 ..."). Anything else is a bug and keeps
its full traceback.

Ctrl-C exits by SIGINT (130 in a shell) and SIGTERM 143, each with one line on stderr (no traceback), in every
phase: importing, composing, planning, starting, running. Both first stop every engine and close the runs
(orchestrator.execution.execute). A signal sent to the whole process group stops the Ray this driver started as
well; Ray is then abandoned (orchestrator.execution.ray_connection) and the process ends with `os._exit` once the runs
are closed. This module imports only the standard library at its top, so that a Ctrl-C while the rest imports is
one line too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Callable, Iterator, Sequence

FULL_ERROR_ENV = "HYDRA_FULL_ERROR"
INTERRUPTED = ("specsweep: {what}: what had started was stopped and its runs closed as KILLED; the same command "
               "resumes the rest")


def _app() -> Callable[[], Any]:
    """The Hydra app (hydra imported here, not at this module's top)."""
    import hydra
    from omegaconf import DictConfig

    from orchestrator.config.schema import register_configs

    register_configs()

    @hydra.main(config_path="pkg://conf", config_name="config", version_base="1.3")
    def app(cfg: DictConfig) -> object:
        from hydra.core.hydra_config import HydraConfig

        from orchestrator.session.launcher import run_single

        hc = HydraConfig.get()
        overrides = tuple(hc.overrides.task)
        try:
            return run_single(cfg, overrides, dry_run=bool(hc.launcher.get("dry_run", False)))
        except Exception as e:  # a refusal exits here, before Hydra's job wrapper adds "Error executing job ..."
            if (message := refusal_message(e, overrides)) is None:
                raise
            sys.exit(message)

    return app


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
    try:
        _main(sys.argv[1:])
    except KeyboardInterrupt as interrupt:  # cleaned up already (execution.execute): one line, not a traceback
        _interrupted(interrupt)


def _main(argv: list[str]) -> None:
    from orchestrator.config.overrides import override_key_problems
    from orchestrator.config.config_error import ConfigError
    from specsweep_common.redact import RedactingStream, override_secrets

    overrides = argv_overrides(argv)
    if problems := override_key_problems(overrides):
        sys.exit(str(ConfigError(problems)))
    # the one output boundary for secrets given on the command line (specsweep_common.redact.RedactingStream)
    secrets = override_secrets(overrides)
    sys.stdout, sys.stderr = RedactingStream(sys.stdout, secrets), RedactingStream(sys.stderr, secrets)
    # SIGTERM is an interrupt from the start (while Ray starts too), not only once the sweep runs (driver_signals)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    app = _app()
    with _errors_reach_main():
        try:
            app()
        except Exception as e:  # noqa: BLE001 - sorted below: a refusal, a compose error, or a bug (re-raised)
            if (message := refusal_message(e, overrides)) is None:
                raise
            sys.exit(message)


@contextlib.contextmanager
def _errors_reach_main() -> Iterator[None]:
    """Hydra re-raises the app's errors instead of reporting them itself (HYDRA_FULL_ERROR, restored after)."""
    before = os.environ.get(FULL_ERROR_ENV)
    os.environ[FULL_ERROR_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FULL_ERROR_ENV, None)
        else:
            os.environ[FULL_ERROR_ENV] = before


def refusal_message(error: BaseException, overrides: Sequence[str]) -> str | None:
    """The one message a refusal or a compose error prints (None: a bug, whose traceback is kept). A refusal is a
    CompactHydraException (ours, or Hydra's own, such as an override it cannot merge); an error raised inside
    Hydra's config loader (OmegaConf's included) while it applies the overrides is a problem naming the override."""
    from hydra.errors import CompactHydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(error, CompactHydraException):
        cause = error.__cause__
        return str(error) + (f"\n{cause}" if isinstance(cause, OmegaConfBaseException) else "")
    override = _composing(error)
    if override is None:
        return None
    from orchestrator.config.config_error import ConfigError
    from specsweep_common.problem import Problem

    key, _, value = override.partition("=")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    hint = ""
    if "NoneType" in reason and "." in key.lstrip("+~"):
        parent = key.lstrip("+~").rsplit(".", 1)[0]
        hint = f"; {parent} is null here: give it whole, e.g. '{parent}={{{key.rsplit('.', 1)[1]}: {value}}}'"
    return str(ConfigError([Problem(key.lstrip("+~"), value, f"an override Hydra can apply to the composed config "
                                                              f"(it raised {type(error).__name__}: {reason}{hint})",
                                    tuple(overrides))]))


def _composing(error: BaseException) -> str | None:
    """The override Hydra was applying when `error` was raised inside its config loader (its frame's `override`),
    or every override when it cannot be told; None when the error was not raised while composing."""
    tb, found, override = error.__traceback__, False, None
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.endswith(os.path.join("hydra", "_internal", "config_loader_impl.py")):
            found = True
            candidate = frame.f_locals.get("override")
            line = getattr(candidate, "input_line", None)
            override = line if isinstance(line, str) else override
        tb = tb.tb_next
    if not found:
        return None
    return override if override is not None else " ".join(argv_overrides(sys.argv[1:])) or "(the overrides)"


def _interrupted(interrupt: KeyboardInterrupt) -> None:
    """One line and the signal's exit code; a second Ctrl-C or SIGTERM while it is said changes nothing (a signal
    to the whole process group can reach this process twice: a second SIGTERM raised inside this print exited 1
    instead of 143, tests/orchestrator/execution/test_interrupts.py, 2026-12-06 on the shared 2-core VM)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    terminated = getattr(interrupt, "exit_code", None) == 128 + signal.SIGTERM  # execution.signals.Terminated
    print(INTERRUPTED.format(what="terminated (SIGTERM)" if terminated else "interrupted (Ctrl-C)"), file=sys.stderr)
    if _ray_abandoned():  # Ray's GCS went with the signal: Ray's own exit would wait 60 s for it
        _exit_now(128 + signal.SIGTERM if terminated else -signal.SIGINT)
    if terminated:
        sys.exit(128 + signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.excepthook = _quiet_interrupt(sys.excepthook)
    raise interrupt  # Python then exits by SIGINT, as a shell expects of Ctrl-C (130)


def _ray_abandoned() -> bool:
    ray_connection = sys.modules.get("orchestrator.execution.ray_connection")
    return ray_connection is not None and ray_connection.ray_abandoned()


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
    from orchestrator.execution.signals import interrupt_for

    raise interrupt_for(signum)


def _quiet_interrupt(hook):
    """sys.excepthook without the traceback of a KeyboardInterrupt (already reported in one line)."""
    def excepthook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            hook(kind, value, tb)
    return excepthook


if __name__ == "__main__":
    main()
