"""`metrics.log_patterns`: named-group regexes over the engine log lines one run produced, as per-step series.

    LogPatterns(patterns).feed(line) / .series     named-group regexes over server log lines -> per-step series
    follow_log(path, offset) -> (lines, new_offset)  new complete lines of a growing log file
    apply_log_patterns(patterns, lines, result) -> [note, ...]
        each non-empty group series into `result.series` (`log_<name>` where the probe already recorded <name>)
    wait_quiet(path)                                 until an engine log has stopped growing (lines written after
                                                     the answer), at most LOG_SETTLE_MAX_S

The runner (`workers.runners.GroupRunner`) feeds the lines from just before a run's cache flush until the log has
been quiet for LOG_SETTLE_S after the probe. Engine-neutral: any engine's log lines.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Iterable

from specsweep_common.spec import RunResult

logger = logging.getLogger(__name__)

LOG_SETTLE_S = 0.1  # log_patterns: the engine log must be this long without growth after a run ...
LOG_SETTLE_MAX_S = 1.0  # ... waiting at most this long for lines the engine writes after its response
LOG_SERIES_PREFIX = "log_"  # a group named like a series or metric the probe already recorded


class LogPatterns:
    """`metrics.log_patterns`: each named group of each regex becomes a series, one value per matching line.

        p = LogPatterns([r"commit=(?P<commit_len>\\d+) depth=(?P<tree_depth>\\d+)"])
        for line in lines: p.feed(line)
        p.series  # {"commit_len": [...], "tree_depth": [...]}
        p.matches  # lines each pattern matched, in pattern order
        p.not_numbers  # {"group": (count, first value)} for captures that are not numbers (left out of series)

    A pattern is searched anywhere in the line (`re.search`); a group that took no part in a match adds nothing.
    Two patterns may name the same group: their values go into one series in line order.
    """

    def __init__(self, patterns: Iterable[str]):
        self.patterns = [re.compile(p) for p in patterns]
        for p in self.patterns:
            if not p.groupindex:
                raise ValueError(f"log pattern {p.pattern!r} has no named group (?P<name>...)")
        self.series: dict[str, list[float]] = {name: [] for p in self.patterns for name in p.groupindex}
        self.matches: list[int] = [0] * len(self.patterns)
        self.not_numbers: dict[str, tuple[int, str]] = {}

    def feed(self, line: str) -> None:
        for i, p in enumerate(self.patterns):
            match = p.search(line)
            if not match:
                continue
            self.matches[i] += 1
            for name, value in match.groupdict().items():
                if value is None:
                    continue
                try:
                    number = float(value)
                except ValueError:
                    count, first = self.not_numbers.get(name, (0, value))
                    self.not_numbers[name] = (count + 1, first)
                    continue
                self.series[name].append(number)

    def feed_all(self, lines: Iterable[str]) -> "LogPatterns":
        for line in lines:
            self.feed(line)
        return self


def follow_log(path: str | Path, offset: int = 0) -> tuple[list[str], int]:
    """Complete lines appended to `path` since byte `offset`, and the offset after the last of them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a partial last line waits for the next call
    return data[:end].decode("utf-8", "replace").splitlines(), offset + end


def apply_log_patterns(patterns: tuple[str, ...] | list[str], lines: list[str], result: RunResult) -> list[str]:
    """Feed one run's engine log lines to `LogPatterns(patterns)` and add each non-empty group series to
    `result.series` (as `log_<name>` where the name is already one of its series or metrics). Returns notes for
    the run's message: patterns that matched no line, groups that captured values that are not numbers."""
    matcher = LogPatterns(patterns).feed_all(lines)
    notes = []
    for i, hits in enumerate(matcher.matches):
        if not hits:
            notes.append(f"metrics.log_patterns[{i}] matched none of the run's {len(lines)} engine log line(s)")
    for name, values in matcher.series.items():
        if values:
            key = LOG_SERIES_PREFIX + name if name in result.series or name in result.metrics else name
            if key != name:
                logger.info("log pattern group %r recorded as %r: the probe already records %r", name, key, name)
            result.series[key] = values
        bad = matcher.not_numbers.get(name)
        if bad:
            notes.append(f"metrics.log_patterns group {name!r} captured {bad[0]} value(s) that are not numbers "
                         f"(e.g. {bad[1]!r}); only numbers become series")
    return notes


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def wait_quiet(path: Path, quiet_s: float = LOG_SETTLE_S, max_s: float = LOG_SETTLE_MAX_S) -> None:
    """Until `path` has not grown for `quiet_s` (lines an engine writes just after answering), at most `max_s`."""
    deadline = time.monotonic() + max_s
    size = file_size(path)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = file_size(path)
        if now == size:
            return
        size = now
