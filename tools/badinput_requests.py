"""More bad `/generate` bodies for the bad-input battery (tools/bench_badinput.py's REQUESTS has the same shape:
(label, () -> body bytes)): each answered 500 (or spoiled its batch) before, a 400 now; the
sub-epsilon temperatures are greedy as in SGLang (200). Kept apart so that the battery can import them
(`REQUESTS + EXTRA_REQUESTS`); the same cases are tests in tests/workers/reference/test_engine_isolation.py."""
from __future__ import annotations

from typing import Callable

EXTRA_REQUESTS: tuple[tuple[str, Callable[[], bytes]], ...] = (
    ("body not UTF-8", lambda: b'{"text": "\x80\x81"}'),
    ("input_ids with a 5000-digit integer", lambda: b'{"input_ids": [' + b"9" * 5000 + b"]}"),
    ("JSON nested 100000 deep", lambda: b"[" * 100_000 + b"]" * 100_000),
    ("temperature 10**400 (an int)", lambda: b'{"input_ids": [1], "sampling_params": {"temperature": 1%s}}'
     % (b"0" * 400)),
    ("temperature 1e39 (beyond float32)", lambda: b'{"input_ids": [1], "sampling_params": {"temperature": 1e39}}'),
    ("temperature 5e-324 (greedy, 200)", lambda: b'{"input_ids": [1], "sampling_params": {"temperature": 5e-324, '
     b'"max_new_tokens": 2}}'),
    ("temperature 4.4e-38 (greedy, 200)", lambda: b'{"input_ids": [1], "sampling_params": {"temperature": 4.4e-38, '
     b'"max_new_tokens": 2}}'),
)
