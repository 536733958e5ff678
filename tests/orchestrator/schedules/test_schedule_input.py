"""Schedule files refused before anything fires, by name, and a bad file never stops the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.schedule import main
from orchestrator.schedules.definition import ScheduleError, load_schedules, read_schedules

GOOD = "cron: '0 2 * * *'\noverrides: ['+sweep=smoke']\n"


def test_a_cron_that_can_never_fire_is_refused_naming_the_schedule(tmp_path: Path):
    (tmp_path / "feb31.yaml").write_text("cron: '0 0 31 2 *'\noverrides: ['+sweep=smoke']\n")
    with pytest.raises(ScheduleError, match=r"schedule 'feb31' .*cron='0 0 31 2 \*'.*fires at least once"):
        load_schedules(tmp_path)


@pytest.mark.parametrize("body,key", [
    ("misfire_grace: .nan\n", "misfire_grace=nan"),
    ("misfire_grace: .inf\n", "misfire_grace=inf"),
    ("name: ../../x\n", "name='../../x'"),
    ("name: ''\n", "name=''"),
])
def test_nan_and_path_names_refused(tmp_path: Path, body: str, key: str):
    (tmp_path / "s.yaml").write_text(GOOD + body)
    with pytest.raises(ScheduleError) as e:
        load_schedules(tmp_path)
    assert key in str(e.value) and "allowed" in str(e.value)


def test_yml_files_are_read_too(tmp_path: Path):
    (tmp_path / "a.yml").write_text(GOOD)
    assert [s.name for s in load_schedules(tmp_path)] == ["a"]


def test_every_schedule_suffix_ships_with_the_package():
    """A *.yml in orchestrator/schedules/ is read from a checkout; an installed wheel must carry it too, or the
    default schedule folder silently loses it."""
    import tomllib

    from orchestrator.schedules.definition import SUFFIXES

    shipped = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    data = shipped["tool"]["setuptools"]["package-data"]["orchestrator"]
    assert {f"schedules/{suffix}" for suffix in SUFFIXES} <= set(data), data


def test_a_missing_schedule_dir_is_an_error(tmp_path: Path):
    with pytest.raises(ScheduleError, match="an existing folder"):
        load_schedules(tmp_path / "nope")
    assert main(["--schedule-dir", str(tmp_path / "nope"), "list"]) == 2


def test_one_bad_file_is_reported_and_the_others_kept(tmp_path: Path):
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "bad.yaml").write_text("cron: 'every day'\noverrides: ['+sweep=smoke']\n")
    (tmp_path / "garbage.yaml").write_bytes(b"\xff\xfe: [")
    schedules, problems = read_schedules(tmp_path)
    assert [s.name for s in schedules] == ["good"]
    assert len(problems) == 2 and any("schedule 'bad'" in p for p in problems)
    assert any("garbage.yaml" in p for p in problems)


def test_a_job_server_that_accepts_and_never_answers_is_a_schedule_error_not_a_hang():
    """Ray's job SDK sends its requests with no deadline; ours carry `request_timeout_s` (a listening socket that
    never accepts: the connection opens in the backlog and no byte ever comes back)."""
    import socket

    from orchestrator.schedules.definition import ScheduleError
    from orchestrator.schedules.ray_jobs import RayJobBackend

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ScheduleError, match=r"did not answer within 1 s \(request_timeout_s\)"):
            RayJobBackend(url, request_timeout_s=1.0)
