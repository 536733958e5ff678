"""SGLang's per-request metrics file (`--export-metrics-to-file --export-metrics-to-file-dir DIR`), kept the same way.

    RequestExport(directory).write(meta_info, params)   one JSON line per finished request

SGLang 0.5.23 (sglang/srt/observability/request_metrics_exporter.py): `FileRequestMetricsExporter` appends one JSON
object per finished request to `DIR/sglang-request-metrics-<YYYYmmdd_HH>.log` (:97-118, the hour of the write),
`{"request_parameters": <the request's fields as a JSON string>, **meta_info}` (`_format_output_data`, :34-62),
written by the tokenizer manager when a request finishes (managers/tokenizer_manager.py:2036-2039). That makes it
the one per-request record both engines keep of a request's speculative counters (`spec_verify_ct`,
`completion_tokens`, `spec_accept_length`: workers/reference/spec_counters.py), whatever client sent it: the load
curves (orchestrator/load) read the per-request accept length from it, since SGLang's bench_serving keeps no
per-request speculative field in its result file.

What differs: `request_parameters` holds the sampling parameters and the prompt length (this engine has no
GenerateReqInput); the engine's own warm-up generation is not written (SGLang's health checks are not either, :134).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

FILE_PREFIX = "sglang-request-metrics-"  # + %Y%m%d_%H + .log (request_metrics_exporter.py:108)
SKIPPED_META = ("spec_steps",)  # ours, per verify step: large, and not one of SGLang's meta_info keys


class RequestExport:
    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()

    def write(self, meta_info: Mapping[str, Any], params: object, prompt_len: int) -> None:
        request = dataclasses.asdict(params) if dataclasses.is_dataclass(params) and not isinstance(params, type) \
            else {}
        record = {"request_parameters": json.dumps({"sampling_params": request, "prompt_len": prompt_len}),
                  **{k: v for k, v in meta_info.items() if k not in SKIPPED_META}}
        path = self.directory / f"{FILE_PREFIX}{datetime.now().strftime('%Y%m%d_%H')}.log"
        line = json.dumps(record) + "\n"
        with self.lock, open(path, "a", encoding="utf-8") as f:
            f.write(line)
