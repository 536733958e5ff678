"""One run's probe: flush the cache, build the prompt(s) of exactly `context_len` tokens, generate `gen_tokens`
greedily (probe.concurrency requests at once), measure (workers.measurement).

    run_probe(base_url, probe, engine, *, expect_spec, timeout_s, model_path=None) -> Measurement
        what a ServerWorker does per RunSpec; the prompts come from workers.prompts (build_prompt, build_prompts:
        exactly context_len tokens per engine), the HTTP calls go through workers.http_client.ProbeClient.
    generate_all(base_url, prompts, gen_tokens) -> (generations, wall_s)
        every prompt at once, a connection and a thread each.

Every HTTP call has a timeout. A response without the fields we need raises BadResponse; a request past
its timeout raises ProbeTimeout (workers.errors).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

from specsweep_common.greedy_output import LOSSLESS_TOP_LOGPROBS
from specsweep_common.spec import EngineKind, ProbeSpec
from workers.http_client import Generation, Prompt, ProbeClient
from workers.measurement import Measurement, meta_number, measure_all
from workers.prompts import build_prompt, build_prompts

logger = logging.getLogger(__name__)


def generate_all(base_url: str, prompts: list[Prompt], gen_tokens: int, temperature: float = 0.0,
                 timeout_s: float = 600.0, top_logprobs_num: int | None = None) -> tuple[list[Generation], float]:
    """Send every prompt at once (a connection and a thread each); (generations in prompt order, wall s from the
    first send to the last answer). The first failure is raised once every request has ended."""
    clients = [ProbeClient(base_url, timeout_s) for _ in prompts]
    t0 = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            futures = [pool.submit(c.generate, p, gen_tokens, temperature, True, top_logprobs_num)
                       for c, p in zip(clients, prompts)]
            concurrent.futures.wait(futures)
            gens = [f.result() for f in futures]
    finally:
        for c in clients:
            c.close()
    return gens, time.perf_counter() - t0


def run_probe(base_url: str, probe: ProbeSpec, engine: EngineKind, *, expect_spec: bool,
              timeout_s: float = 600.0, model_path: str | None = None, flush: bool = True,
              prompt: Prompt | None = None, version: str | None = None,
              max_depth: int | None = None, repeat: int = 0) -> Measurement:
    """Flush, build the prompt(s), generate (probe.concurrency requests at once), measure. `version`: SGLang's
    meta_info names (specsweep_common.sglang_facts.SGLANG_VERSIONS; None: told apart by the names); `max_depth`: the most
    drafts one verify step can accept, for depth_accept_rate; `repeat`: which of probe.repeats texts (workers.prompts)."""
    # without speculation, at temperature 0: the top-2 logprobs of each output token (the lossless check's ties)
    top = LOSSLESS_TOP_LOGPROBS if not expect_spec and probe.temperature == 0 else None
    client = ProbeClient(base_url, timeout_s)
    try:
        if flush:
            client.flush_cache()
        if probe.concurrency == 1:
            prompts = [prompt or build_prompt(probe, engine, model_path, repeat=repeat)]
            t0 = time.perf_counter()
            gens = [client.generate(prompts[0], probe.gen_tokens, probe.temperature, top_logprobs_num=top)]
            wall = time.perf_counter() - t0
    finally:
        client.close()
    if probe.concurrency > 1:
        prompts = build_prompts(probe, engine, model_path, repeat=repeat)
        gens, wall = generate_all(base_url, prompts, probe.gen_tokens, probe.temperature, timeout_s, top)
    out = measure_all(gens, expect_spec, wall, version=version, max_depth=max_depth)
    for i, (p, gen) in enumerate(zip(prompts, gens)):
        who = f"request {i}: " if len(gens) > 1 else ""
        got_prompt, got = meta_number(gen.meta_info, "prompt_tokens"), meta_number(gen.meta_info, "completion_tokens")
        if p.num_tokens is not None and got_prompt != p.num_tokens:
            out.notes.append(f"{who}sent {p.num_tokens} prompt tokens, engine reports {got_prompt:.0f}")
        if got != probe.gen_tokens:
            out.notes.append(f"{who}asked {probe.gen_tokens} tokens, engine generated {got:.0f}")
    for note in out.notes:
        logger.warning("%s: %s", base_url, note)
    return out
