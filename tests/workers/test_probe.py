"""Probe prompts (exact lengths, determinism, novel text) and a real engine round trip (the metric arithmetic:
test_measurement.py)."""

from __future__ import annotations

import json

import pytest

from specsweep_common.spec import EngineKind, ProbeKind, ProbeSpec
from workers.engine_process import EngineProcess
from workers.errors import BadResponse
from workers.http_client import ProbeClient
from workers.probe import run_probe
from workers.prompts import NOVEL_NGRAM, build_prompt, build_prompts, novel_text, novel_words, probe_text
from workers.reference.adapter import engine_tokenizer
from workers.reference.tokenizer import ByteTokenizer
from tools.testing import tiny_server

REF = EngineKind.REFERENCE


@pytest.mark.parametrize("kind", [ProbeKind.PREDICTABLE, ProbeKind.NOVEL])
@pytest.mark.parametrize("n", [1, 7, 1000, 16_384])
def test_prompt_has_exactly_context_len_tokens(kind, n):
    prompt = build_prompt(ProbeSpec(kind=kind, context_len=n, gen_tokens=4), REF)
    assert prompt.text is None and len(prompt.input_ids) == n
    assert all(0 <= i < 256 for i in prompt.input_ids)


@pytest.mark.parametrize("kind", [ProbeKind.PREDICTABLE, ProbeKind.NOVEL])
@pytest.mark.parametrize("n", [7, 1000, 8000])
def test_gguf_model_prompt_uses_the_engines_bpe_tokenizer(kind, n):
    """smollm2-135m: exactly n ids of the GGUF's own BPE (what the engine counts), decoding to the probe text."""
    probe = ProbeSpec(kind=kind, context_len=n, gen_tokens=4)
    prompt = build_prompt(probe, REF, "smollm2-135m")
    tok = engine_tokenizer("smollm2-135m")
    assert prompt.text is None and len(prompt.input_ids) == n
    assert max(prompt.input_ids) >= 256  # BPE ids, not bytes
    text = tok.decode(list(prompt.input_ids))
    assert probe_text(probe, len(text)).startswith(text)
    assert len(text) >= 3 * n  # several characters a token: real words, not bytes
    assert tok.encode(text)[:n - 1] == list(prompt.input_ids[:n - 1])


def test_predictable_repeats_the_sentence():
    prompt = build_prompt(ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=240, gen_tokens=4), REF)
    assert ByteTokenizer().decode(list(prompt.input_ids)) == ("The cat sat on the mat. " * 10)


def test_novel_is_deterministic_per_seed():
    a = build_prompt(ProbeSpec(kind=ProbeKind.NOVEL, context_len=5000, gen_tokens=4, seed=1), REF)
    b = build_prompt(ProbeSpec(kind=ProbeKind.NOVEL, context_len=5000, gen_tokens=4, seed=1), REF)
    c = build_prompt(ProbeSpec(kind=ProbeKind.NOVEL, context_len=5000, gen_tokens=4, seed=2), REF)
    assert a == b and a != c


def test_novel_words_never_repeat_an_ngram():
    it = novel_words(seed=0)
    words = [next(it) for _ in range(40_000)]  # ~ 250k bytes: more than the longest sweep context
    grams = [tuple(words[i:i + NOVEL_NGRAM]) for i in range(len(words) - NOVEL_NGRAM + 1)]
    assert len(set(grams)) == len(grams)
    assert len(set(words)) > 300  # not a tiny vocabulary cycling


def test_novel_text_reads_as_sentences():
    text = novel_text(3, 400)
    assert len(text) >= 400 and text[0].isupper() and text.rstrip().endswith(".")


def test_file_probe_text_and_jsonl(tmp_path):
    txt = tmp_path / "book.txt"
    txt.write_text("Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. ")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"text": t}) for t in ["first doc", "second doc"]) + "\n")
    p = build_prompt(ProbeSpec(kind=ProbeKind.FILE, context_len=1001, gen_tokens=1, path=str(txt)), REF)
    assert len(p.input_ids) == 1001  # multi-byte characters may be cut: ids, not text, are exact
    q = build_prompt(ProbeSpec(kind=ProbeKind.FILE, context_len=21, gen_tokens=1, path=str(jsonl)), REF)
    assert ByteTokenizer().decode(list(q.input_ids)) == "first doc\n\nsecond doc"


def test_sglang_without_tokenizer_sends_text():
    p = build_prompt(ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=100, gen_tokens=1), EngineKind.SGLANG,
                     model_path="/nonexistent/model")
    assert p.input_ids is None and len(p.text) == 400


@pytest.mark.parametrize("kind", [ProbeKind.PREDICTABLE, ProbeKind.NOVEL])
def test_concurrent_prompts_have_exact_lengths_and_distinct_prefixes(kind):
    probe = ProbeSpec(kind=kind, context_len=200, gen_tokens=4, concurrency=4)
    prompts = build_prompts(probe, REF)
    assert len(prompts) == 4 and prompts[0] == build_prompt(probe, REF)
    assert all(len(p.input_ids) == 200 for p in prompts)
    assert len({p.input_ids[:12] for p in prompts}) == 4  # "Request i. " prefixes
    assert bytes(prompts[2].input_ids).startswith(b"Request 2. ")


@pytest.fixture(scope="module")
def oracle_engine(tmp_path_factory):
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with EngineProcess.for_server(tiny_server("oracle", num_steps=4), log) as engine:
        yield engine


@pytest.mark.parametrize("kind", [ProbeKind.PREDICTABLE, ProbeKind.NOVEL])
def test_run_probe_against_the_reference_engine(oracle_engine, kind):
    probe = ProbeSpec(kind=kind, context_len=300, gen_tokens=21)
    m = run_probe(oracle_engine.base_url, probe, REF, expect_spec=True, timeout_s=60)
    assert m.metrics["prompt_tokens"] == 300 and m.metrics["completion_tokens"] == 21
    assert m.metrics["commit_len_mean"] == 5.0  # oracle: num_steps + 1 on every step
    assert set(m.series["commit_len"]) == {5.0} and m.metrics["accept_rate"] == 1.0
    assert 0 < m.metrics["ttft_s"] < m.metrics["e2e_s"] and m.metrics["decode_tok_s"] > 0
    assert len(m.artifacts["steps.csv"].splitlines()) == m.metrics["verify_steps"] + 1
    assert not m.notes


def test_run_probe_sends_concurrency_requests_at_once(oracle_engine):
    probe = ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=120, gen_tokens=24, concurrency=4)
    m = run_probe(oracle_engine.base_url, probe, REF, expect_spec=True, timeout_s=60)
    assert m.metrics["requests"] == 4 and m.metrics["completion_tokens"] == 24 and m.metrics["prompt_tokens"] == 120
    assert m.metrics["commit_len_mean"] == 5.0  # the oracle, batched
    assert m.metrics["batch_size_mean"] > 1  # the engine decoded them together
    assert m.metrics["throughput_tok_s"] == pytest.approx(4 * 24 / m.metrics["wall_s"])
    assert m.metrics["throughput_tok_s"] > m.metrics["decode_tok_s"] / 2
    assert not m.notes
    one = run_probe(oracle_engine.base_url, ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=120, gen_tokens=24),
                    REF, expect_spec=True, timeout_s=60)
    assert one.metrics["requests"] == 1 and one.metrics["batch_size_mean"] == 1
    assert one.metrics["throughput_tok_s"] == pytest.approx(24 / one.metrics["wall_s"])


def test_output_ids_are_recorded_with_top2_logprobs_only_where_the_lossless_check_needs_them(oracle_engine):
    """A run without speculation (expect_spec=False) asks for top_logprobs_num=2: output_ids.json carries them; a
    speculative run records its ids only. The ids are the same (the engine is lossless)."""
    from specsweep_common.greedy_output import OUTPUT_IDS_ARTIFACT, GreedyOutput

    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=100, gen_tokens=11)
    plain = GreedyOutput.from_json(run_probe(oracle_engine.base_url, probe, REF, expect_spec=False,
                                             timeout_s=60).artifacts[OUTPUT_IDS_ARTIFACT])
    spec = GreedyOutput.from_json(run_probe(oracle_engine.base_url, probe, REF, expect_spec=True,
                                            timeout_s=60).artifacts[OUTPUT_IDS_ARTIFACT])
    assert len(plain.output_ids) == 11 and len(plain.top2) == 11 and spec.top2 == ()
    assert spec.output_ids == plain.output_ids and [t[0][1] for t in plain.top2] == list(plain.output_ids)


def test_non_streaming_generate_and_bad_request(oracle_engine):
    client = ProbeClient(oracle_engine.base_url, timeout_s=60)
    prompt = build_prompt(ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=50, gen_tokens=5), REF)
    gen = client.generate(prompt, 5, stream=False)
    assert gen.client_ttft_s is None and len(gen.output_ids) == 5
    with pytest.raises(BadResponse, match="400"):
        client.generate(prompt, 0)


def test_a_tokenizer_without_a_vocabulary_falls_back_to_text(tmp_path):
    """A model dir with only config.json makes transformers build a 1-token tokenizer: the prompt builder must not
    grow the text forever (it used to, until the process ran out of memory)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 1,
        "vocab_size": 64, "max_position_embeddings": 4096}))
    p = build_prompt(ProbeSpec(kind=ProbeKind.PREDICTABLE, context_len=100, gen_tokens=1), EngineKind.SGLANG,
                     model_path=str(tmp_path))
    assert p.input_ids is None and len(p.text) == 400


STORY = "Ignore the text above. Write a short story about a lighthouse keeper."


@pytest.mark.parametrize("n", [200, 1024, 8160])
def test_a_task_prompt_is_one_chat_turn_of_exactly_context_len_tokens(n):
    """probe.task on smollm2-135m: the GGUF's ChatML frame (as transformers renders it) around the novel text and the
    task, the assistant's turn opened, n ids in all; the text part is the probe text's own start."""
    transformers = pytest.importorskip("transformers")
    from workers.reference.tokenizer_export import hf_tokenizer_dir

    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=n, gen_tokens=4, task=STORY)
    ids = build_prompt(probe, REF, "smollm2-135m").input_ids
    assert ids is not None and len(ids) == n
    tok = transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir("smollm2-135m", 2048))
    text = tok.decode(list(ids))
    rendered = tok.apply_chat_template([{"role": "user", "content": "@@\n\n" + STORY}], tokenize=False,
                                       add_generation_prompt=True)
    head, tail = rendered.split("@@")
    assert text.startswith(head) and text.endswith(tail) and tail.endswith("<|im_start|>assistant\n")
    body = text[len(head):len(text) - len(tail)]
    assert probe_text(probe, len(body) + 100).startswith(body[:-20]) and len(body) > 2 * (n - 60)
    # without a task the same probe is a plain continuation (what every earlier run measured)
    assert build_prompt(ProbeSpec(kind=ProbeKind.NOVEL, context_len=n, gen_tokens=4), REF, "smollm2-135m") \
        .input_ids != ids


def test_a_task_on_the_byte_models_uses_their_chatml_and_the_identity_only_moves_with_a_task():
    from specsweep_common.spec import stable_hash

    probe = ProbeSpec(kind=ProbeKind.NOVEL, context_len=300, gen_tokens=4, task="Say hi.")
    ids = build_prompt(probe, REF).input_ids
    assert ids is not None and len(ids) == 300
    text = bytes(ids).decode()
    assert text.startswith("<|im_start|>user\n") and text.endswith("Say hi.<|im_end|>\n<|im_start|>assistant\n")
    plain = ProbeSpec(kind=ProbeKind.NOVEL, context_len=300, gen_tokens=4)
    assert stable_hash(plain) == stable_hash(ProbeSpec(kind=ProbeKind.NOVEL, context_len=300, gen_tokens=4, task=""))
    assert stable_hash(plain) != stable_hash(probe)


def test_a_task_that_leaves_no_room_is_refused_with_the_frame_size():
    with pytest.raises(ValueError, match=r"context_len=20 leaves no room .* allowed: context_len > \d+"):
        build_prompt(ProbeSpec(kind=ProbeKind.NOVEL, context_len=20, gen_tokens=4, task=STORY), REF, "smollm2-135m")


def test_sglang_with_a_task_and_no_tokenizer_is_refused_not_sent_without_its_frame(tmp_path):
    with pytest.raises(ValueError, match="probe.task=.*needs the chat template"):
        build_prompt(ProbeSpec(kind=ProbeKind.NOVEL, context_len=100, gen_tokens=4, task="Say hi."),
                     EngineKind.SGLANG, model_path=str(tmp_path / "absent"))
