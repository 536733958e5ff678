"""Ctrl-C and SIGTERM on the driver.

    Terminated                      KeyboardInterrupt for SIGTERM; `python -m orchestrator` exits 143 on it
    driver_signals() -> shield      for the sweep's duration: SIGINT and SIGTERM raise KeyboardInterrupt (SIGTERM:
                                    Terminated), never inside `with shield():`, where the signal waits for the
                                    shield to end; a SIGTERM that Ray turned into a plain KeyboardInterrupt leaves
                                    as Terminated
    sigterm_as_interrupt() -> shield   the handlers alone (the closing of the MLflow runs uses its shield)

Handlers are installed on the main thread only; elsewhere the shield is a no-op.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, ContextManager, Iterator

Shield = Callable[[], ContextManager[object]]


class Terminated(KeyboardInterrupt):
    """SIGTERM on the driver: cleaned up as Ctrl-C is, then `python -m orchestrator` exits 143 (128 + SIGTERM),
    not as if interrupted by SIGINT."""

    exit_code = 128 + signal.SIGTERM


def interrupt_for(signum: int) -> KeyboardInterrupt:
    return Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt(f"signal {signum}")


class Interrupts:
    """SIGINT and SIGTERM raise KeyboardInterrupt (SIGTERM: its subclass Terminated), but never inside `shield()`
    (a result being recorded in MLflow, the interrupt being cleaned up): there the signal waits for the shield
    to end."""

    last: int | None = None  # the latest signal handled, by any instance

    def __init__(self) -> None:
        self.depth = 0
        self.pending: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        Interrupts.last = signum
        if self.depth:
            self.pending = signum
            return
        raise interrupt_for(signum)

    @contextlib.contextmanager
    def shield(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending is not None:
                signum, self.pending = self.pending, None
                raise interrupt_for(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[Shield]:
    """Yields `shield()` (a context manager); signal handlers only on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield contextlib.nullcontext
        return
    interrupts = Interrupts()
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield interrupts.shield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def driver_signals() -> Iterator[Shield]:
    """`sigterm_as_interrupt()` for a whole sweep; a KeyboardInterrupt that leaves it after a SIGTERM is Terminated
    (Ray's `ray.wait` turns our Terminated into its own KeyboardInterrupt)."""
    Interrupts.last = None
    try:
        with sigterm_as_interrupt() as shield:
            yield shield
    except KeyboardInterrupt as e:
        if type(e) is KeyboardInterrupt and Interrupts.last == signal.SIGTERM:
            raise interrupt_for(signal.SIGTERM) from e
        raise
