"""`make ui`: a taken port gives another; the printed links open each sweep's saved view."""

from __future__ import annotations

import socket

from tools.mlflow_ui import pick_port, sweep_links


def test_a_taken_port_gives_a_free_one():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        port = pick_port(taken)
        assert port != taken
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free indeed
    assert pick_port(taken) == taken  # free again: the preferred port


def test_links_name_each_sweep_with_its_saved_view(tmp_path):
    from orchestrator.results.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "probe")
    from orchestrator.results.ui_view import publish_view

    publish_view(tracker.client, tracker.experiment_id, ("drafter",))
    assert sweep_links(tmp_path / "mlflow.db", "http://127.0.0.1:5001") == [
        f"  probe: http://127.0.0.1:5001/#/experiments/{tracker.experiment_id}/runs?viewStateShareKey=specsweep"]
    assert sweep_links(tmp_path / "none.db", "http://x") == []
