"""The reference engine with CUDA graphs (workers/reference/cuda_graph.py).

CPU: the graph runner's static-buffer path without capture (padding to T buckets, masks, slots) reproduces the
plain runner token for token, and batched steps (several running requests) run eagerly with each request's own
tokens. GPU (marked gpu): greedy output with specsweep_verify + CUDA graphs equals the torch
backend's (with --disable-fused-ops: every op in torch) token for token, graphs were replayed, and
--disable-cuda-graph runs without them. Fused element-wise kernels are on by default on CUDA only.
"""
from __future__ import annotations

import pytest
import torch

from workers.reference.args import parse_args
from workers.reference.cuda_graph import BUCKETS, GraphModelRunner, bucket_for, use_cuda_graph
from workers.reference.engine import Engine, SamplingParams

ORACLE = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "tiny",
          "--speculative-num-steps", "7", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"]
NGRAM_TREE = ["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3", "--speculative-eagle-topk", "3",
              "--speculative-num-draft-tokens", "7"]


def _engine(*flags: str) -> Engine:
    return Engine(parse_args(["--model-path", "tiny", "--load-format", "dummy", "--context-length", "2048", *flags]))


def _graph_runners_without_capture(engine: Engine) -> None:
    """Swap the engine's runners for GraphModelRunners (capture=False) sharing model, pool and backend."""
    def swap(r):
        g = GraphModelRunner(r.model, r.backend, page_size=r.page_size, max_total_tokens=r.pool.num_slots,
                             max_seq_tokens=r.max_seq_tokens, chunked_prefill_size=r.chunk, device=r.device,
                             capture=False)
        g.pool = r.pool
        return g
    engine.target = swap(engine.target)
    if engine.drafter is not None and hasattr(engine.drafter, "runner"):
        engine.drafter.runner = swap(engine.drafter.runner)


def test_buckets():
    assert [bucket_for(t) for t in (1, 2, 3, 5, 8, 9, 64)] == [1, 2, 4, 8, 8, 16, 64]
    assert bucket_for(65) is None and BUCKETS[-1] == 64


def test_use_cuda_graph_only_for_the_kernel_on_cuda():
    model = _engine().model
    args = parse_args(["--model-path", "tiny", "--attention-backend", "specsweep_verify"])
    assert use_cuda_graph(args, torch.device("cuda"), model)
    assert not use_cuda_graph(args, torch.device("cpu"), model)
    args.disable_cuda_graph = True
    assert not use_cuda_graph(args, torch.device("cuda"), model)
    assert not use_cuda_graph(parse_args(["--model-path", "tiny"]), torch.device("cuda"), model)


def test_fused_ops_default_on_cuda_only():
    assert not _engine().model.fused_ops  # CPU: torch ops (the kernels would need the interpreter)
    if torch.cuda.is_available():
        assert _engine("--device", "cuda").model.fused_ops
        assert not _engine("--device", "cuda", "--disable-fused-ops").model.fused_ops


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("flags", [ORACLE, NGRAM_TREE], ids=["oracle", "ngram-tree"])
def test_padded_static_path_matches_plain_runner_on_cpu(page_size, flags):
    """T of 3, 5, 6, 7 are padded to 4 / 8; padded rows must not change a single greedy token."""
    common = ["--page-size", str(page_size), *flags]
    plain, padded = _engine(*common), _engine(*common)
    _graph_runners_without_capture(padded)
    prompt = plain.encode("The cat sat on the mat. The dog sat on the log. " * 4)
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    assert padded.generate(prompt, params).output_ids == plain.generate(prompt, params).output_ids


def _concurrently(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    import threading

    outs: list = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, engine.generate(prompts[i], params).output_ids))
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    return outs


@pytest.mark.parametrize("flags", [ORACLE, NGRAM_TREE], ids=["oracle", "ngram-tree"])
def test_graph_runner_batches_eagerly_and_alone_through_its_static_path_on_cpu(flags):
    """Several running requests: the step runs eagerly (graphs are for one request); their tokens are still
    each request's own."""
    engine = _engine("--page-size", "4", *flags)
    _graph_runners_without_capture(engine)
    prompts = [engine.encode(t) for t in ("The cat sat on the mat. " * 4, "x y z " * 9, "The dog. " * 20)]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    alone = [engine.generate(p, params).output_ids for p in prompts]
    assert engine.target.eager_batches == 0
    assert _concurrently(engine, prompts, params) == alone
    assert engine.target.eager_batches > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("flags", [[], ORACLE, NGRAM_TREE], ids=["decode", "oracle-chain", "ngram-tree"])
def test_greedy_kernel_with_graphs_equals_torch_on_gpu(dtype, flags):
    common = ["--device", "cuda", "--dtype", dtype, "--page-size", "16", *flags]
    reference = _engine("--attention-backend", "torch", "--disable-fused-ops", *common)  # all torch ops
    kernel = _engine("--attention-backend", "specsweep_verify", *common)  # + fused element-wise kernels
    assert isinstance(kernel.target, GraphModelRunner)
    assert kernel.model.fused_ops and not reference.model.fused_ops
    prompt = reference.encode("The cat sat on the mat. " * 40)
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    expected = reference.generate(prompt, params).output_ids
    got = kernel.generate(prompt, params).output_ids
    assert kernel.target.replays > 0
    if dtype == "float32":
        assert got == expected
    else:  # bf16: the kernel's fp32 accumulation order differs from torch's; a near-tie may flip late
        same = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(expected))
        assert same >= 16, (got, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.timeout(600)
def test_concurrent_requests_with_graphs_on_gpu():
    """Batched steps run eagerly (the kernel once per request), lone steps replay graphs; fp32 tokens equal each
    request's own."""
    engine = _engine("--device", "cuda", "--attention-backend", "specsweep_verify", "--page-size", "16", *ORACLE)
    prompts = [engine.encode(t) for t in ("The cat sat on the mat. " * 40, "x y z " * 9, "The dog. " * 70)]
    params = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    alone = [engine.generate(p, params).output_ids for p in prompts]
    assert engine.target.replays > 0
    assert _concurrently(engine, prompts, params) == alone
    assert engine.target.eager_batches > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_disable_cuda_graph_on_gpu():
    engine = _engine("--device", "cuda", "--attention-backend", "specsweep_verify", "--disable-cuda-graph")
    assert not isinstance(engine.target, GraphModelRunner)
    assert len(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0)).output_ids) == 4
