"""What the runner reads from an SGLang engine around each run, besides the probe's answers and the counters both
engines export (`workers.adapter.CountersObserver`):

- once per engine start, `/server_info` (the resolved server args): every run of that engine gets them as
  `sglang.<key>` tags (backends for prefill/decode/verify, num_steps, topk, draft tokens, ...), and a note in its
  message (tag `sglang.changed`) where SGLang runs something other than the config asked
  (`workers.sglang.argv.server_arg_changes`, e.g. NGRAM's num_steps); the reported args also give the probe its
  `max_depth`, and `engine.version` its meta_info names;
- after each probe, `engine_accept_length_metrics` (Prometheus counter deltas over the run), a cross-check of
  `engine_accept_length` from meta_info. `/server_info`'s avg_spec_accept_length is not recorded: SGLang reports it
  over complete 40-iteration windows only (workers.meta_info says why);
- with `attention=specsweep_verify`, the plugin's dispatch counters from `/metrics` before and after each run
  (`workers.sglang.plugin_counter_deltas`): `plugin_kernel_calls`, `plugin_fallback_calls` and the fallbacks by reason.

A failure to read any of them is a note, never a failed run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from specsweep_common.sglang_facts import SGLANG_VERSIONS
from specsweep_common.spec import ServerSpec
from workers.adapter import CountersObserver
from workers.engine_counters import accept_length_from_counters, scrape_metrics
from workers.errors import BadResponse, ProbeTimeout
from workers.http_client import ProbeClient
from workers.sglang.argv import max_draft_depth, reported_server_args, server_arg_changes, server_arg_tags, uses_plugin
from workers.sglang.plugin_counter_deltas import Counts, read_dispatch, record_dispatch

logger = logging.getLogger(__name__)


@dataclass
class SGLangServerArgs:
    """What one SGLang engine start reported in /server_info."""

    pid: int | None
    reported: dict  # workers.sglang.argv.reported_server_args; {} when /server_info could not be read
    tags: dict[str, str]  # sglang.<key>, sglang.changed
    notes: list[str]  # for each run's message


def read_server_args(base_url: str, server: ServerSpec, pid: int | None = None) -> SGLangServerArgs:
    """/server_info once: the resolved args as tags, and a note per value SGLang changed from the config's."""
    client = ProbeClient(base_url, timeout_s=30.0)
    try:
        info = client.server_info()
    except (BadResponse, ProbeTimeout, ValueError) as e:
        return SGLangServerArgs(pid, {}, {}, [f"/server_info not read: {e}"])
    finally:
        client.close()
    reported = reported_server_args(info)
    changes = server_arg_changes(server, info)
    tags = server_arg_tags(reported)
    if changes:
        tags["sglang.changed"] = "; ".join(changes)
    return SGLangServerArgs(pid, reported, tags, changes)


def engine_cross_checks(base_url: str, before: dict[str, float] | None, metrics: dict[str, float],
                        after: dict[str, float] | None = None) -> list[str]:
    """After a probe: engine_accept_length_metrics (/metrics deltas from `before` to `after`, scraped now when not
    given) into `metrics`; notes for what failed."""
    notes = []
    after = after if after is not None else scrape_metrics(base_url)
    value = accept_length_from_counters(before, after) if before is not None and after is not None else None
    if value is not None:
        metrics["engine_accept_length_metrics"] = value
    elif "verify_steps" in metrics:
        notes.append("/metrics gave no accept length for the run (no counters or no verify call)")
    return notes


class SGLangObserver(CountersObserver):
    def __init__(self, server: ServerSpec):
        super().__init__(server)
        self.plugin = uses_plugin(server)  # specsweep_verify: its dispatch counters per run
        self.server_args: SGLangServerArgs | None = None  # /server_info of the engine now running
        self.dispatch_before: Counts | None = None

    def before_run(self, base_url: str, pid: int | None) -> None:
        if self.server_args is None or self.server_args.pid != pid:
            self.server_args = read_server_args(base_url, self.server, pid)
            for note in self.server_args.notes:
                logger.warning("group %s: %s", self.server.key, note)
        super().before_run(base_url, pid)
        self.dispatch_before = read_dispatch(base_url) if self.plugin else None

    def probe_kwargs(self) -> dict[str, Any]:
        args = self.server_args
        version = self.server.engine.version
        return {"version": version if version in SGLANG_VERSIONS else None,
                "max_depth": max_draft_depth(args.reported) if args is not None and args.reported else None}

    def after_run(self, base_url: str, metrics: dict[str, float], tags: dict[str, str]) -> list[str]:
        notes = super().after_run(base_url, metrics, tags)
        if self.server_args is not None:
            tags.update(self.server_args.tags)
            notes += self.server_args.notes
            notes += engine_cross_checks(base_url, self.before, metrics, after=self.after)
        if self.plugin:
            notes += record_dispatch(base_url, self.dispatch_before, metrics)
        return notes
