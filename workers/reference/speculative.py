"""Speculative decoding: draft trees (n-gram lookup or a draft model) verified in one target forward.

A tree's node 0 is the root: the last committed token, whose K/V is not yet in the target cache. The
verify forward runs all N nodes under the ancestor mask; from the root we follow the child whose token
equals the target's choice at each node (argmax at temperature 0, a sample otherwise: matching a
target sample against a deterministic draft is lossless), then add the target's token at the last
accepted node (the bonus). Rejected nodes' K/V are rolled back.

Every step is batched over the running requests: one drafter call proposes a tree per request (a draft model runs
one forward per tree level over all of them), one target forward verifies all trees (`verify_batch`); each
request keeps its own paged sequence, tree and acceptance.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .kv_cache import PagedSequence
from .runner import ModelRunner

# tools/bench_regress.py only: proposals capped at this many tokens, a matcher build that is worse without any flag,
# config or grid point saying so (what the regression check must catch and attribute to the point's history).
ENV_WORSE_NGRAM = "SPECSWEEP_BENCH_NGRAM_MAX_STEPS"
# tests only: a broken pipeline with healthy counters. Each verify step commits its accepted drafts and, instead of
# the target's bonus token, the last accepted draft again (or the root): the acceptance counts are those of a
# working engine, the text is wrong ("The cat cat sat..."), as with SGLang 0.5.18's CPU attention, which dropped
# the drafts from seq_lens. What the diagnosis' lossless check (orchestrator/results/diagnosis.py) must catch.
ENV_FAULT_REPEAT_BONUS = "SPECSWEEP_TEST_FAULT_REPEAT_BONUS"

logger = logging.getLogger(__name__)


@dataclass
class DraftTree:
    tokens: list[int]   # [N]; node 0 = root
    parents: list[int]  # [N]; parents[0] = -1, parents[i] < i

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        depth = [0] * self.num_nodes
        for i in range(1, self.num_nodes):
            depth[i] = depth[self.parents[i]] + 1
        return depth

    def ancestor_mask(self) -> Tensor:
        """[N, N] bool: node i sees node j iff j is i or an ancestor of i."""
        mask = np.zeros((self.num_nodes, self.num_nodes), dtype=np.bool_)  # numpy: per-op cost is host time
        for i in range(self.num_nodes):
            if i:
                mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return torch.from_numpy(mask)

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for i in range(1, self.num_nodes):
            kids[self.parents[i]].append(i)
        return kids


class SamplingError(ValueError):
    """One request's sampling failed (its distribution is not finite): that request fails, the batch goes on."""


def sample(logits: Tensor, temperature: float, generator: torch.Generator | None = None) -> list[int]:
    # logits: [N, V] -> one token per row
    if temperature <= 0:
        return logits.argmax(-1).tolist()
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)  # the generator lives on the CPU
    if not bool(torch.isfinite(probs).all()):
        raise SamplingError(f"temperature={temperature!r}: the float32 sampling distribution is not finite "
                            "(logits / temperature overflow); allowed: 0 (greedy), or a temperature that keeps "
                            "logits / temperature within float32")
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).tolist()


@dataclass
class VerifyResult:
    committed: list[int]  # accepted drafts + bonus
    accepted: int         # drafts accepted (bonus excluded)
    tree_depth: int
    tree_nodes: int
    verify_s: float
    error: SamplingError | None = None  # this request's sampling failed: nothing committed, the others go on
    rows: Tensor | None = None  # the target's logits at every tree node, [N, V]
    path: tuple[int, ...] = ()  # the accepted nodes from the root: committed[j] was chosen from rows[path[j]]

    def committed_logits(self) -> Tensor:
        """[len(committed), V]: the logits each committed token was chosen from (a draft equals the target's choice
        at its parent node; the bonus is the choice at the last accepted node)."""
        if self.rows is None:
            raise RuntimeError("verify result without its logits")
        return self.rows[list(self.path)]


def verify_batch(runner: ModelRunner, seqs: list[PagedSequence], trees: list[DraftTree], temperatures: list[float],
                 generators: list[torch.Generator | None], *, repeat_bonus: bool = False) -> list[VerifyResult]:
    """One target forward over every request's tree; then each request's walk, commit and rollback.
    verify_s is the whole batched step's time. `repeat_bonus`: the test fault of ENV_FAULT_REPEAT_BONUS."""
    t0 = time.perf_counter()
    bases = [seq.length for seq in seqs]
    depths = [tree.depths() for tree in trees]
    hidden = runner.forward_batch(seqs, [torch.tensor(t.tokens) for t in trees], [torch.tensor(d) for d in depths],
                                  [t.ancestor_mask() for t in trees])
    logits = runner.model.logits(torch.cat(hidden)).split([t.num_nodes for t in trees])  # [N_i, V] each
    results = []
    for seq, tree, base, depth, rows, temperature, gen in zip(seqs, trees, bases, depths, logits, temperatures,
                                                              generators):
        try:
            choice = sample(rows, temperature, gen)  # [N_i] target token at each node
        except SamplingError as exc:
            seq.commit_path(base, [0])  # the root only: the request leaves the batch with this error
            results.append(VerifyResult([], 0, max(depth), tree.num_nodes, 0.0, exc))
            continue
        kids = tree.children()
        node, path = 0, [0]
        while True:
            nxt = next((c for c in kids[node] if tree.tokens[c] == choice[node]), None)
            if nxt is None:
                break
            node = nxt
            path.append(node)
        seq.commit_path(base, path)
        committed = [tree.tokens[n] for n in path[1:]] + [tree.tokens[node] if repeat_bonus else choice[node]]
        results.append(VerifyResult(committed, len(path) - 1, max(depth), tree.num_nodes, 0.0, rows=rows,
                                    path=tuple(path)))
    verify_s = time.perf_counter() - t0
    for r in results:
        r.verify_s = verify_s
    return results


def verify_tree(runner: ModelRunner, seq: PagedSequence, tree: DraftTree, temperature: float,
                generator: torch.Generator | None = None) -> VerifyResult:
    return verify_batch(runner, [seq], [tree], [temperature], [generator])[0]


class Drafter:
    """Proposes a tree rooted at each request's context[-1]. `start` / `finish` bracket one request and make / drop
    its draft state (None for a stateless drafter); `propose` drafts for several requests at once."""

    def start(self, prompt: list[int], target_seq: PagedSequence | None = None) -> object:
        """A request begins; target_seq is the target's sequence (its prompt prefilled). Returns its draft state."""
        return None

    def propose(self, states: list, contexts: list[list[int]]) -> list[DraftTree]:
        raise NotImplementedError

    def finish(self, state) -> None:
        pass


class NgramDrafter(Drafter):
    """Prompt lookup: earlier occurrences of the context's last n tokens (longest n first, most recent
    first) propose what followed them; up to `topk` continuations of `num_steps` tokens merged in a trie of at most
    `num_draft_tokens` nodes, the root included. A chain (topk 1) is as long as its nodes allow, whatever the steps:
    SGLang's NGRAM fills num_draft_tokens nodes and verifies them all (sglang/srt/speculative/ngram_worker.py:99-120),
    so 8 draft tokens verify chains of up to 7 drafts."""

    def __init__(self, num_steps: int, topk: int, num_draft_tokens: int, min_window: int, max_window: int):
        self.num_steps = num_draft_tokens - 1 if topk == 1 else num_steps
        self.topk, self.max_nodes = topk, num_draft_tokens
        if worse := os.environ.get(ENV_WORSE_NGRAM):  # a worse matcher the grid point cannot see (bench only)
            self.num_steps = min(self.num_steps, int(worse))
        self.min_window, self.max_window = min_window, max_window

    def _matches(self, ctx: np.ndarray) -> list[int]:
        """Start indices of continuations, best first."""
        n = len(ctx)
        cand = np.nonzero(ctx[:-1] == ctx[-1])[0]  # earlier positions j with ctx[j] == last token
        match = np.ones(len(cand), dtype=np.int64)
        alive = np.ones(len(cand), dtype=bool)
        # grow each match backwards, vectorised over candidates; the suffix compared, ctx[n-1-k], exists only for
        # k < n (a negative index would wrap around, or be out of bounds for a context shorter than the window)
        for k in range(1, min(self.max_window, n)):
            j = cand - k
            ok = alive & (j >= 0)
            ok[ok] &= ctx[j[ok]] == ctx[n - 1 - k]
            match += ok
            alive = ok
        keep = match >= self.min_window
        cand, match = cand[keep], match[keep]
        order = np.lexsort((-cand, -match))  # longest match, then most recent
        return (cand[order] + 1).tolist()

    def propose(self, states: list, contexts: list[list[int]]) -> list[DraftTree]:
        return [self.propose_one(context) for context in contexts]

    def propose_one(self, context: list[int]) -> DraftTree:
        tokens, parents = [context[-1]], [-1]
        ctx = np.asarray(context, dtype=np.int64)
        branches = 0
        for start in self._matches(ctx):
            if branches >= self.topk or len(tokens) >= self.max_nodes:
                break
            cont = ctx[start:start + self.num_steps].tolist()
            node, grew = 0, False
            for tok in cont:
                child = next((c for c in range(1, len(tokens)) if parents[c] == node and tokens[c] == tok), None)
                if child is None:
                    if len(tokens) >= self.max_nodes:
                        break
                    tokens.append(tok)
                    parents.append(node)
                    child, grew = len(tokens) - 1, True
                node = child
            branches += grew
        return DraftTree(tokens, parents)


class ModelDrafter(Drafter):
    """A draft model with its own paged KV (a request's draft state is its draft sequence). The cache holds the
    committed tokens; drafted nodes are rolled back after each proposal. Expands the `topk` best nodes per depth
    (cumulative log-prob), keeps the best `num_draft_tokens - 1` nodes overall (ancestor-closed). Each tree level
    is one draft forward over all requests of the batch."""

    def __init__(self, runner: ModelRunner, num_steps: int, topk: int, num_draft_tokens: int,
                 same_as_target: bool = False):
        """same_as_target: the draft model is the target (the oracle): its prompt K/V would be what the target's
        prefill already computed, so `start` copies those rows instead of a second prefill."""
        self.runner, self.num_steps, self.topk, self.max_nodes = runner, num_steps, topk, num_draft_tokens
        self.same_as_target = same_as_target

    def start(self, prompt: list[int], target_seq: PagedSequence | None = None) -> PagedSequence:
        seq = self.runner.new_sequence()
        n = len(prompt) - 1  # the root (last prompt token) is fed by the first proposal
        if n >= 1 and self.same_as_target and target_seq is not None and target_seq.length >= n:
            seq.reserve(n)
            self.runner.pool.copy_from(target_seq.pool, target_seq.slots(0, n), seq.slots(0, n))
            seq.length = n
        elif n >= 1:
            self.runner.extend(seq, prompt[:-1])
        return seq

    def finish(self, state: PagedSequence) -> None:
        state.release()

    def _expand(self, logits: Tensor, parents: list[int], scores: list[float], nodes: list[tuple]) -> list[int]:
        """Add the top-k children of each parent (rows of logits) to `nodes`; return the new frontier."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        top_lp, top_tok = logp.topk(self.topk, dim=-1)  # [F, k]
        new = []
        for row, parent in enumerate(parents):
            depth = 1 if parent < 0 else nodes[parent][2] + 1
            for lp, tok in zip(top_lp[row].tolist(), top_tok[row].tolist()):
                nodes.append((scores[row] + lp, tok, depth, parent))  # (score, token, depth, parent node)
                new.append(len(nodes) - 1)
        new.sort(key=lambda i: -nodes[i][0])
        return new[:self.topk]

    def propose(self, states: list[PagedSequence], contexts: list[list[int]]) -> list[DraftTree]:
        seqs, runner, B = states, self.runner, len(states)
        # catch up on the committed tokens, root last: [C_i] each
        hidden = runner.forward_batch(seqs, [torch.tensor(c[s.length:]) for s, c in zip(seqs, contexts)])
        root_logits = runner.model.logits(torch.cat([h[-1:] for h in hidden]))  # [B, V]
        bases = [s.length for s in seqs]
        nodes: list[list[tuple]] = [[] for _ in range(B)]
        frontiers = [self._expand(root_logits[i:i + 1], [-1], [0.0], nodes[i]) for i in range(B)]
        expanded: list[list[int]] = [[] for _ in range(B)]
        for _ in range(self.num_steps - 1):
            for e, f in zip(expanded, frontiers):
                e += f
            hidden = runner.forward_batch(
                seqs, [torch.tensor([n[i][1] for i in e]) for n, e in zip(nodes, expanded)],
                [torch.tensor([n[i][2] - 1 for i in e]) for n, e in zip(nodes, expanded)],
                [self._mask(e, n) for n, e in zip(nodes, expanded)])
            for seq, base in zip(seqs, bases):
                seq.truncate(base)
            rows = [h[len(e) - len(f):] for h, e, f in zip(hidden, expanded, frontiers)]  # the frontier's rows
            logits = runner.model.logits(torch.cat(rows)).split([len(f) for f in frontiers])
            frontiers = [self._expand(lg, f, [n[i][0] for i in f], n) for lg, f, n in zip(logits, frontiers, nodes)]
        return [self._select(c[-1], n) for c, n in zip(contexts, nodes)]

    @staticmethod
    def _mask(expanded: list[int], nodes: list[tuple]) -> Tensor:
        index = {n: i for i, n in enumerate(expanded)}
        mask = torch.zeros(len(expanded), len(expanded), dtype=torch.bool)
        for i, n in enumerate(expanded):
            p = nodes[n][3]
            if p >= 0:
                mask[i] = mask[index[p]]
            mask[i, i] = True
        return mask

    def _select(self, root: int, nodes: list[tuple]) -> DraftTree:
        order = sorted(range(len(nodes)), key=lambda i: (-nodes[i][0], nodes[i][2], i))
        chosen: list[int] = []
        chosen_set = set()
        for i in order:
            if len(chosen) >= self.max_nodes - 1:
                break
            if nodes[i][3] < 0 or nodes[i][3] in chosen_set:
                chosen.append(i)
                chosen_set.add(i)
        rank = {n: k for k, n in enumerate(chosen)}
        chosen.sort(key=lambda i: (nodes[i][2], rank[i]))
        index = {n: k + 1 for k, n in enumerate(chosen)}
        return DraftTree([root] + [nodes[i][1] for i in chosen],
                         [-1] + [index.get(nodes[i][3], 0) for i in chosen])


class SelfDrafter(ModelDrafter):
    """Self-speculation: a subset of the target's layers (model.layer_subset) drafts, reading the K/V the target
    already wrote for those layers: the runner shares the target's pool and a request's draft state is the
    target's own sequence. No draft prefill and no draft cache: each proposal writes the root and the drafted
    nodes after the committed prefix and rolls them all back; the target's verify then writes those positions.
    With skipped layers, a kept layer after the gap reads prefix K/V that the full stack computed: an approximation
    that only changes what is drafted (verification decides what is committed)."""

    def start(self, prompt: list[int], target_seq: PagedSequence | None = None) -> PagedSequence:
        if target_seq is None or target_seq.pool is not self.runner.pool:
            raise ValueError("SelfDrafter needs the target's sequence, in the pool it shares")
        return target_seq

    def finish(self, state: PagedSequence) -> None:
        pass  # the target owns the sequence

    def propose(self, states: list[PagedSequence], contexts: list[list[int]]) -> list[DraftTree]:
        for seq, ctx in zip(states, contexts):  # the target's cache holds all but the root (context[-1])
            if seq.length != len(ctx) - 1:
                raise RuntimeError(f"target cache holds {seq.length} tokens, context has {len(ctx)}")
        trees = super().propose(states, contexts)  # feeds each root, drafts, rolls the drafts back
        for seq, ctx in zip(states, contexts):
            seq.truncate(len(ctx) - 1)  # and the root: the target's verify writes it
        return trees
