"""The plugin's per-step planning under CUDA-graph capture, as SGLang drives it: one ForwardBatch for two eager
warm-ups and the captured run (0.5.10: one metadata hook before all three), then replays after the metadata
buffers changed in place. Each layer does what forward_decode / forward_extend do (StepCache.enter, the step's
inputs, run_layer_attention); SGLang itself is not imported (its server cannot run here)."""
import pytest
import torch

from specsweep_kernels import verify_attention as va
from specsweep_kernels.problems import Layout, random_tree_mask
from specsweep_kernels.reference import verify_attention_reference
from specsweep_kernels.sglang_plugin import StepCache, decode_step_inputs, run_layer_attention, verify_step_inputs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LAYOUT = Layout(8, 2, 128, 128, mla=False)
BATCH, WIDTH, NUM_LAYERS = 3, 9000, 3  # requests, req_to_token row width, layers of the model
BF16_TOL = 1e-2


class ForwardBatch:
    """Only its identity matters to StepCache."""


def _metadata(num_tokens: int) -> dict:
    """SGLang's buffers, allocated once at their largest and refilled in place per step."""
    g = torch.Generator().manual_seed(0)
    slots = torch.randperm(4 * WIDTH, generator=g).int().view(4, WIDTH).cuda()
    return dict(req_to_token=slots, pool_rows=torch.tensor([2, 0, 3], device="cuda"),
                seq_lens=torch.zeros(BATCH, dtype=torch.int64, device="cuda"),
                kv_indptr=torch.zeros(BATCH + 1, dtype=torch.int32, device="cuda"),
                kv_indices=torch.zeros(BATCH * WIDTH, dtype=torch.int32, device="cuda"),
                custom_mask=torch.zeros(BATCH * num_tokens * (WIDTH + num_tokens), dtype=torch.bool, device="cuda"),
                mask_indptr=torch.zeros(BATCH + 1, dtype=torch.int32, device="cuda"), trees=[])


def _fill(meta: dict, prefix_lens: list[int], num_tokens: int, seed: int) -> None:
    """What SGLang's metadata init writes for a step: decode seq_lens; verify kv_indptr / kv_indices and the flat
    custom mask (per request a row-major [T, prefix + T] block, prefix columns True)."""
    g = torch.Generator().manual_seed(seed)
    meta["seq_lens"].copy_(torch.tensor(prefix_lens) + 1)
    rows = meta["req_to_token"][meta["pool_rows"]]
    meta["kv_indptr"].copy_(torch.tensor([0] + prefix_lens).cumsum(0))
    meta["kv_indices"][: sum(prefix_lens)] = torch.cat([rows[b, :n] for b, n in enumerate(prefix_lens)])
    meta["trees"] = [random_tree_mask(num_tokens, g) for _ in prefix_lens]
    blocks = [torch.cat([torch.ones(num_tokens, n, dtype=torch.bool), tree], 1).flatten()
              for n, tree in zip(prefix_lens, meta["trees"])]
    meta["custom_mask"][: sum(map(len, blocks))] = torch.cat(blocks).cuda()
    meta["mask_indptr"].copy_(torch.tensor([0] + [len(b) for b in blocks]).cumsum(0))


def _layers(num_tokens: int) -> list[dict]:
    d, hq, hkv = LAYOUT.k_head_dim, LAYOUT.num_q_heads, LAYOUT.num_kv_heads
    rows = BATCH * num_tokens
    return [dict(k_buffer=torch.randn(4 * WIDTH, hkv, d, device="cuda", dtype=torch.bfloat16),
                 v_buffer=torch.randn(4 * WIDTH, hkv, d, device="cuda", dtype=torch.bfloat16),
                 q=torch.empty(rows, hq * d, device="cuda", dtype=torch.bfloat16),
                 k=torch.empty(rows, hkv, d, device="cuda", dtype=torch.bfloat16),
                 v=torch.empty(rows, hkv, d, device="cuda", dtype=torch.bfloat16)) for _ in range(NUM_LAYERS)]


@pytest.mark.parametrize("mode,num_tokens", [("decode", 1), ("verify", 4)])
def test_one_plan_per_captured_step_replays_with_new_lengths(mode, num_tokens, monkeypatch):
    launches = []
    launch = va._launch_plan
    monkeypatch.setattr(va, "_launch_plan", lambda *a, **kw: launches.append(a[3]) or launch(*a, **kw))
    meta, layers = _metadata(num_tokens), _layers(num_tokens)
    ws = va.allocate_workspace(max_batch=BATCH, max_tokens=num_tokens, num_q_heads=LAYOUT.num_q_heads,
                               v_head_dim=LAYOUT.v_head_dim, device="cuda")
    step, fb = StepCache(), ForwardBatch()
    dev = torch.device("cuda")

    def make_inputs():
        if mode == "decode":
            return decode_step_inputs(req_to_token=meta["req_to_token"], req_pool_indices=meta["pool_rows"],
                                      seq_lens=meta["seq_lens"], batch=BATCH, device=dev)
        return verify_step_inputs(kv_indptr=meta["kv_indptr"], kv_indices=meta["kv_indices"],
                                  custom_mask=meta["custom_mask"], mask_indptr=meta["mask_indptr"], batch=BATCH,
                                  num_tokens=num_tokens, device=dev)

    def forward() -> list[torch.Tensor]:  # every layer of one step, as the backend's forward methods run them
        outs = []
        for layer in layers:
            step.enter(fb, capturing=torch.cuda.is_current_stream_capturing())
            inputs = step.inputs((mode, num_tokens), make_inputs)
            outs.append(run_layer_attention(
                step, q=layer["q"], k=layer["k"], v=layer["v"], k_buffer=layer["k_buffer"],
                v_buffer=layer["v_buffer"], num_q_heads=LAYOUT.num_q_heads, num_kv_heads=LAYOUT.num_kv_heads,
                head_dim=LAYOUT.k_head_dim, sm_scale=LAYOUT.k_head_dim ** -0.5, batch=BATCH,
                num_tokens=num_tokens, workspace=ws, inputs=inputs))
        return outs

    def new_inputs(prefix_lens: list[int], seed: int) -> None:
        _fill(meta, prefix_lens, num_tokens, seed)
        for layer in layers:
            for name in ("q", "k", "v"):
                layer[name].copy_(torch.randn_like(layer[name]))

    new_inputs([1000, 40, 4000], seed=1)
    step.new_step()  # the capture hook
    for _ in range(2):  # SGLang's warm-ups
        forward()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        outs = forward()
    torch.cuda.current_stream().wait_stream(stream)
    assert launches == [BATCH, BATCH], "warm-up 1 plans, warm-up 2 reuses it, the captured run plans once"

    for i, prefix_lens in enumerate(([1000, 40, 4000], [8191, 1, 300], [0, 5000, 17], [2, 2, 8999])):
        new_inputs(prefix_lens, seed=10 + i)
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        tree = torch.stack(meta["trees"]).cuda()
        indptr = meta["kv_indptr"]
        addressing = dict(kv_indptr=indptr, kv_indices=meta["kv_indices"][: int(indptr[-1])])
        for layer, out in zip(layers, outs):
            shape = (BATCH, num_tokens, -1, LAYOUT.k_head_dim)
            ref = verify_attention_reference(
                q=layer["q"].view(shape), k_buffer=layer["k_buffer"], v_buffer=layer["v_buffer"],
                k_new=layer["k"].view(shape), v_new=layer["v"].view(shape), tree_mask=tree,
                sm_scale=LAYOUT.k_head_dim ** -0.5, **addressing).reshape(out.shape)
            assert not out.isnan().any()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < BF16_TOL, f"{mode} replay at prefix {prefix_lens}: relative error {err:.2e}"
    assert len(launches) == 2, "replays run the captured plan kernel, no Python"
