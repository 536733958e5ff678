"""A schedule: one YAML file of `orchestrator/schedules/` (or `--schedule-dir`), parsed and checked, and its
firing times.

    load_schedules(directory=None, *, grid=True) -> list[Schedule]   every file checked, the sweep's own rules
                                                       included (grid=False: keys and conflicts only, no grid
                                                       composed); one ScheduleError lists every problem of every file
    read_schedules(directory=None) -> (schedules, problems)   the good files and one line per bad one (the daemon
                                                       keeps firing the good ones); a missing folder is an error
    Schedule.firings_between(after, until), .next_firing(now), .submission_id(scheduled), .entrypoint()
"""

from __future__ import annotations

import datetime as dt
import importlib.resources
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from orchestrator.results.regress.alert import argv_problem
from specsweep_common.domain import NAME, Num

UTC = dt.timezone.utc
ALLOWED_KEYS = ("name", "cron", "timezone", "overrides", "enabled", "misfire_grace", "allow_overlap", "on_regression")
SUFFIXES = ("*.yaml", "*.yml")  # schedule files
MISFIRE_GRACE = Num(0, 7 * 86400)  # seconds


class ScheduleError(ValueError):
    """A schedule file that cannot be used; the message names the schedule, key, value and what is allowed."""


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    timezone: str
    overrides: tuple[str, ...]
    enabled: bool = True
    misfire_grace_s: float = 3600.0
    allow_overlap: bool = False
    on_regression: tuple[str, ...] = ()  # argv run with the report's path when the sweep finds a regression

    @property
    def sweep(self) -> str | None:
        for o in self.overrides:
            key, _, value = o.lstrip("+~").partition("=")
            if key == "sweep":
                return value
        return None

    def firings_between(self, after: dt.datetime, until: dt.datetime) -> Iterator[dt.datetime]:
        """Scheduled times t (UTC) with after < t <= until."""
        tz = ZoneInfo(self.timezone)
        it = croniter(self.cron, after.astimezone(tz))
        while True:
            t = it.get_next(dt.datetime).astimezone(UTC)
            if t > until:
                return
            yield t

    def next_firing(self, now: dt.datetime) -> dt.datetime:
        return croniter(self.cron, now.astimezone(ZoneInfo(self.timezone))).get_next(dt.datetime).astimezone(UTC)

    def submission_id(self, scheduled: dt.datetime) -> str:
        return f"{self.name}-{scheduled.astimezone(UTC):%Y%m%dT%H%M%SZ}"

    def entrypoint(self) -> str:
        """The sweep command (built as argv, joined for Ray's string entrypoint)."""
        return shlex.join([sys.executable, "-m", "orchestrator", *self.overrides])


def default_schedule_dir() -> Path:
    """orchestrator/schedules/, this package: its YAML files are package data, not under `conf/` (Hydra would offer
    them as a config group)."""
    return Path(str(importlib.resources.files("orchestrator.schedules")))


def known_sweeps() -> list[str]:
    sweep_dir = Path(str(importlib.resources.files("conf"))) / "sweep"
    return sorted(p.stem for p in sweep_dir.glob("*.yaml"))


def parse_schedule(raw: object, *, source: str, sweeps: Sequence[str]) -> Schedule:
    """Validate one schedule mapping; every problem is reported at once."""
    if not isinstance(raw, dict):
        raise ScheduleError(f"{source}: expected a mapping of {', '.join(ALLOWED_KEYS)}, got {type(raw).__name__}")
    name = Path(source).stem if raw.get("name") is None else str(raw["name"])
    problems: list[str] = []

    def bad(key: str, value: object, allowed: str) -> None:
        problems.append(f"schedule '{name}' ({source}): {key}={value!r} is invalid; allowed: {allowed}")

    if why := NAME.why_not(name):  # it becomes a Ray submission id and a state key
        bad("name", name, why)
    for key in sorted(set(raw) - set(ALLOWED_KEYS)):
        bad(key, raw[key], "keys " + ", ".join(ALLOWED_KEYS))
    cron = raw.get("cron")
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        bad("cron", cron, "a 5-field cron expression such as '0 2 * * *'")
    elif not _can_fire(cron):
        bad("cron", cron, "a cron expression that fires at least once (this one names a date that never comes, "
            "e.g. 31 February)")
    tz = raw.get("timezone", "UTC")
    try:
        ZoneInfo(str(tz))
    except (ZoneInfoNotFoundError, ValueError):
        bad("timezone", tz, "an IANA time-zone name such as 'UTC' or 'Europe/Berlin'")
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        bad("overrides", overrides, "a list of Hydra override strings, e.g. ['+sweep=longctx']")
        overrides = []
    grace = raw.get("misfire_grace", 3600)
    if isinstance(grace, bool) or (why := MISFIRE_GRACE.why_not(grace)):
        bad("misfire_grace", grace, f"seconds: {MISFIRE_GRACE.describe()}")
    on_regression = raw.get("on_regression", [])
    if "on_regression" in raw and (why := argv_problem(on_regression)) is not None:
        bad("on_regression", on_regression, why)
        on_regression = []
    elif on_regression and "resume=false" not in overrides:  # a resumed sweep re-measures nothing to compare
        bad("overrides", list(overrides), "with on_regression, a list containing 'resume=false'")
    for key in ("enabled", "allow_overlap"):
        if key in raw and not isinstance(raw[key], bool):
            bad(key, raw[key], "true or false")
    schedule = Schedule(
        name=name, cron=str(cron), timezone=str(tz), overrides=tuple(overrides),
        enabled=bool(raw.get("enabled", True)),
        misfire_grace_s=float(grace) if isinstance(grace, (int, float)) else 0.0,
        allow_overlap=bool(raw.get("allow_overlap", False)), on_regression=tuple(on_regression),
    )
    if not overrides or schedule.sweep is None:
        if isinstance(raw.get("overrides", []), (list, tuple)):
            bad("overrides", list(overrides), "a list containing '+sweep=<name>' with <name> one of " + ", ".join(sweeps))
    elif schedule.sweep not in sweeps:
        bad("sweep", schedule.sweep, "one of " + ", ".join(sweeps))
    if problems:
        raise ScheduleError("\n".join(problems))
    return schedule


def _can_fire(cron: str) -> bool:
    """croniter accepts day-month pairs that never occur (`0 0 31 2 *`) and fails only when asked the next time."""
    try:
        croniter(cron, dt.datetime(2000, 1, 1, tzinfo=UTC)).get_next(dt.datetime)
    except Exception:  # noqa: BLE001 - croniter's CroniterBadDateError and friends
        return False
    return True


def sweep_problems(schedule: Schedule, *, source: str, grid: bool = True) -> list[str]:
    """The schedule's overrides checked with the sweep's own rules (`python -m orchestrator` would refuse
    them before starting anything); a problem shared by several grid points is listed once. `grid=False`: only
    what needs no composition (unknown keys, conflicting overrides), for `specsweep-schedule list`."""
    from orchestrator.config.jobs import check_overrides
    from orchestrator.config.overrides import override_key_problems

    counts: dict[tuple[str, str, str], int] = {}
    for p in check_overrides(schedule.overrides) if grid else override_key_problems(schedule.overrides):
        key = (p.key, repr(p.value), p.allowed)
        counts[key] = counts.get(key, 0) + 1
    return [f"schedule '{schedule.name}' ({source}): {key}={value} is invalid; allowed: {allowed}"
            + (f" (in {n} grid points)" if n > 1 else "") for (key, value, allowed), n in counts.items()]


def load_schedules(directory: Path | None = None, *, grid: bool = True) -> list[Schedule]:
    """Every schedule of `directory`, each checked as its sweep would be (`grid=False`: without composing its
    grid); raises one ScheduleError listing every problem of every file."""
    schedules, problems = read_schedules(directory, grid=grid)
    if problems:
        raise ScheduleError("\n".join(problems))
    return schedules


def read_schedules(directory: Path | None = None, *, grid: bool = True) -> tuple[list[Schedule], list[str]]:
    """The schedules of `directory` that pass every check, and one message per problem of the others; raises
    ScheduleError when the folder itself does not exist."""
    import yaml

    directory = directory or default_schedule_dir()
    if not Path(directory).is_dir():
        raise ScheduleError(f"--schedule-dir={str(directory)!r}: allowed: an existing folder of schedule files "
                            f"({', '.join(SUFFIXES)})")
    sweeps = known_sweeps()
    schedules: list[Schedule] = []
    problems: list[str] = []
    for path in sorted(p for pattern in SUFFIXES for p in Path(directory).glob(pattern)):
        try:
            schedule = parse_schedule(yaml.safe_load(path.read_text()), source=str(path), sweeps=sweeps)
            if bad := sweep_problems(schedule, source=str(path), grid=grid):
                raise ScheduleError("\n".join(bad))
            schedules.append(schedule)
        except ScheduleError as e:
            problems.append(str(e))
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
            problems.append(f"{path}: not a readable YAML file: {str(e).splitlines()[0]}")
    names = [s.name for s in schedules]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"schedule '{n}': name used by more than one file in {directory}; allowed: unique names")
        schedules = [s for s in schedules if s.name != n]
    return schedules, problems
