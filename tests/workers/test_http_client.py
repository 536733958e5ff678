"""A per-request timeout: the failure names engine.request_timeout_s and the time measured, and the next run on
that server gets a clean server: its /flush_cache waits (up to its own request timeout) for the engine to drop the
abandoned request, instead of failing with "/flush_cache answered 400". The real reference engine process."""
from __future__ import annotations

import pytest

from tools.testing import reference_process
from workers.errors import ProbeTimeout
from workers.http_client import Prompt, ProbeClient

pytestmark = pytest.mark.timeout(300)

FLAGS = ["--model-path", "tiny", "--load-format", "dummy", "--context-length", "4096", "--page-size", "16",
         "--attention-backend", "torch", "--random-seed", "0"]
PROMPT = Prompt(input_ids=tuple(range(3, 40)))


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_timeout_names_the_key_and_the_next_run_gets_a_clean_server(stream):
    with reference_process(FLAGS) as (url, _):
        slow = ProbeClient(url, timeout_s=0.2)
        with pytest.raises(ProbeTimeout) as e:  # 4000 tokens on CPU take far longer than 0.2 s
            slow.generate(PROMPT, 4000, stream=stream)
        slow.close()
        message = str(e.value)
        assert "engine.request_timeout_s=0.2" in message and "measured" in message, message
        nxt = ProbeClient(url, timeout_s=120)
        try:
            nxt.flush_cache()  # the abandoned generation may still be stopping: waited for, not a 400
            assert len(nxt.generate(PROMPT, 8).output_ids) == 8
        finally:
            nxt.close()
