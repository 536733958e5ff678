"""A run's greedy output as the lossless check reads it: the artifact `output_ids.json`.

    GreedyOutput(output_ids, top2=())       request 0's output token ids (repeat 0), and for a run without speculation
                                            the two best (logprob, token id) at each output position
    GreedyOutput.to_json() / from_json(text) the artifact's text, and back (ValueError naming what is malformed)
    GreedyOutput.first_divergence(other)    the first position where two outputs differ (None: equal)

The probe writes it on every run (workers/measurement.py); the report (orchestrator/results/report/read_back.py) reads it back for
the diagnosis' lossless check (orchestrator/results/diagnosis.py). Standard library only: both sides import it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

OUTPUT_IDS_ARTIFACT = "output_ids.json"
LOSSLESS_TOP_LOGPROBS = 2  # top_logprobs_num asked for by runs without speculation: the two candidates of a tie

Candidate = tuple[float, int]  # (logprob, token id)


@dataclass(frozen=True)
class GreedyOutput:
    output_ids: tuple[int, ...]
    top2: tuple[tuple[Candidate, Candidate], ...] = ()  # per output position, best first; () when not recorded

    def to_json(self) -> str:
        body: dict = {"output_ids": list(self.output_ids)}
        if self.top2:
            body["top_logprobs"] = [[[lp, tok] for lp, tok in pos] for pos in self.top2]
        return json.dumps(body)

    @classmethod
    def from_json(cls, text: str) -> GreedyOutput:
        try:
            body = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{OUTPUT_IDS_ARTIFACT} is not JSON: {e}") from e
        ids = body.get("output_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
            raise ValueError(f"{OUTPUT_IDS_ARTIFACT}: output_ids must be a list of token ids, got {str(ids)[:100]}")
        top = body.get("top_logprobs") or []
        return cls(tuple(ids), tuple(parse_top2(pos, i) for i, pos in enumerate(top)))

    def first_divergence(self, other: GreedyOutput) -> int | None:
        """The first position where the two outputs differ, or where the shorter one ends; None when equal."""
        for k, (a, b) in enumerate(zip(self.output_ids, other.output_ids)):
            if a != b:
                return k
        n, m = len(self.output_ids), len(other.output_ids)
        return None if n == m else min(n, m)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_top2(pos, index: int) -> tuple[Candidate, Candidate]:
    """One output position's candidates, [[logprob, token_id, ...], ...] best first (SGLang's output_top_logprobs
    entry, or this artifact's): its two best as ((logprob, id), (logprob, id)). ValueError names what is wrong."""
    if not isinstance(pos, list) or len(pos) < 2:
        raise ValueError(f"top logprobs at output position {index}: need the 2 best entries, got {str(pos)[:100]}")
    out = []
    for entry in pos[:2]:
        if not (isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[0], (int, float))
                and not isinstance(entry[0], bool) and math.isfinite(entry[0]) and _is_int(entry[1])):
            raise ValueError(f"top logprobs at output position {index}: an entry is not [logprob, token_id], got "
                             f"{str(entry)[:100]}")
        out.append((float(entry[0]), int(entry[1])))
    if out[0][0] < out[1][0]:
        raise ValueError(f"top logprobs at output position {index}: not best first: {out}")
    return out[0], out[1]
