"""SGLang's per-request metrics file (`--export-metrics-to-file`) on the reference engine
(workers/reference/request_export.py): one line per finished request, in SGLang's file and record format, from any
route, the engine's own warm-up left out."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from workers.reference.args import parse_args
from workers.reference.request_export import FILE_PREFIX
from workers.reference.server import ServerState, create_app

FLAGS = ["--model-path", "tiny", "--load-format", "dummy", "--context-length", "512", "--page-size", "16",
         "--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3", "--random-seed", "0"]


def test_every_finished_request_is_one_line_with_its_meta_info(tmp_path):
    out = tmp_path / "metrics"
    state = ServerState(parse_args([*FLAGS, "--export-metrics-to-file", "--export-metrics-to-file-dir", str(out)]))
    state.load()  # its warm-up generation is not a client's request: not written
    assert not list(out.glob("*"))
    with TestClient(create_app(state)) as client:
        native = client.post("/generate", json={"text": "abcabcabc", "sampling_params": {
            "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}).json()
        client.post("/v1/completions", json={"prompt": "abcabc", "max_tokens": 6, "temperature": 0,
                                             "ignore_eos": True, "stream": True})
    (path,) = out.glob(FILE_PREFIX + "*.log")
    first, second = (json.loads(ln) for ln in path.read_text().splitlines())
    assert path.name[len(FILE_PREFIX):-len(".log")].replace("_", "").isdigit()  # %Y%m%d_%H, as SGLang
    assert json.loads(first["request_parameters"])["sampling_params"]["max_new_tokens"] == 8
    assert {k: first[k] for k in native["meta_info"] if k != "spec_steps"} == \
        {k: v for k, v in first.items() if k != "request_parameters"}
    for rec, tokens in ((first, 8), (second, 6)):
        assert rec["completion_tokens"] == tokens and rec["spec_verify_ct"] >= 1
        assert rec["spec_accept_length"] == pytest.approx(tokens / rec["spec_verify_ct"])


def test_the_file_needs_its_directory():
    with pytest.raises(SystemExit):
        parse_args([*FLAGS, "--export-metrics-to-file"])
