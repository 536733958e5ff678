"""A probe file's content: UTF-8 text, or JSONL with a string "text" per line (what workers.prompts.file_text reads)."""

from __future__ import annotations

import json

from specsweep_common.problem import Problem


def probe_file_problem(key_value: str, name: str, raw: bytes, overrides: tuple[str, ...] = ()) -> Problem | None:
    """A probe file must hold text: UTF-8, not blank; JSONL (.jsonl/.ndjson) lines are objects with a string
    "text" (what workers.prompts.file_text reads)."""

    def bad(why: str) -> Problem:
        return Problem("probe.path", key_value, f"a UTF-8 text or JSONL file with text ({why})", overrides)

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return bad(f"it is not UTF-8: {e.reason} at byte {e.start}")
    if name.endswith((".jsonl", ".ndjson")):
        texts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                return bad(f"line {n} is not JSON: {e.msg}")
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                return bad(f'line {n} has no string "text" field')
            texts.append(record["text"])
        text = "".join(texts)
        if not text.strip():
            return bad('no line has a non-blank "text"')
    elif not text.strip():
        return bad("it is empty" if not text else "it holds only whitespace")
    return None
