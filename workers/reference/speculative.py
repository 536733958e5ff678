"""Speculative decoding: draft trees (n-gram lookup or a draft model) verified in one target forward.

A tree's node 0 is the root: the last committed token, whose K/V is not yet in the target cache. The
verify forward runs all N nodes under the ancestor mask; from the root we follow the child whose token
equals the target's choice at each node (argmax at temperature 0, a sample otherwise: matching a
target sample against a deterministic draft is lossless), then add the target's token at the last
accepted node (the bonus). Rejected nodes' K/V are rolled back.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .kv_cache import PagedSequence
from .runner import ModelRunner

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


def sample(logits: Tensor, temperature: float, generator: torch.Generator | None = None) -> list[int]:
    # logits: [N, V] -> one token per row
    if temperature <= 0:
        return logits.argmax(-1).tolist()
    probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)  # the generator lives on the CPU
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1).tolist()


@dataclass
class VerifyResult:
    committed: list[int]  # accepted drafts + bonus
    accepted: int         # drafts accepted (bonus excluded)
    tree_depth: int
    tree_nodes: int
    verify_s: float


def verify_tree(runner: ModelRunner, seq: PagedSequence, tree: DraftTree, temperature: float,
                generator: torch.Generator | None = None) -> VerifyResult:
    t0 = time.perf_counter()
    base = seq.length
    depths = tree.depths()
    hidden = runner.forward(seq, torch.tensor(tree.tokens), torch.tensor(depths), tree.ancestor_mask())
    choice = sample(runner.model.logits(hidden), temperature, generator)  # [N] target token at each node
    kids = tree.children()
    node, path = 0, [0]
    while True:
        nxt = next((c for c in kids[node] if tree.tokens[c] == choice[node]), None)
        if nxt is None:
            break
        node = nxt
        path.append(node)
    seq.commit_path(base, path)
    committed = [tree.tokens[n] for n in path[1:]] + [choice[node]]
    return VerifyResult(committed, len(path) - 1, max(depths), tree.num_nodes, time.perf_counter() - t0)


class Drafter:
    """Proposes a tree rooted at context[-1]; `start`/`finish` bracket one request."""

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, context: list[int]) -> DraftTree:
        raise NotImplementedError

    def finish(self) -> None:
        pass


class NgramDrafter(Drafter):
    """Prompt lookup: earlier occurrences of the context's last n tokens (longest n first, most recent
    first) propose what followed them; up to `topk` continuations of `num_steps` tokens merged in a trie."""

    def __init__(self, num_steps: int, topk: int, num_draft_tokens: int, min_window: int, max_window: int):
        self.num_steps, self.topk, self.max_nodes = num_steps, topk, num_draft_tokens
        self.min_window, self.max_window = min_window, max_window

    def _matches(self, ctx: np.ndarray) -> list[int]:
        """Start indices of continuations, best first."""
        n = len(ctx)
        cand = np.nonzero(ctx[:-1] == ctx[-1])[0]  # earlier positions j with ctx[j] == last token
        match = np.ones(len(cand), dtype=np.int64)
        alive = np.ones(len(cand), dtype=bool)
        for k in range(1, self.max_window):  # grow each match backwards, vectorised over candidates
            j = cand - k
            ok = alive & (j >= 0) & (n - 1 - k >= 0)
            ok[ok] &= ctx[j[ok]] == ctx[n - 1 - k]
            match += ok
            alive = ok
        keep = match >= self.min_window
        cand, match = cand[keep], match[keep]
        order = np.lexsort((-cand, -match))  # longest match, then most recent
        return (cand[order] + 1).tolist()

    def propose(self, context: list[int]) -> DraftTree:
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
    """A draft model with its own paged KV. Its cache holds the committed tokens; drafted nodes are
    rolled back after each proposal. Expands the `topk` best nodes per depth (cumulative log-prob),
    keeps the best `num_draft_tokens - 1` nodes overall (ancestor-closed)."""

    def __init__(self, runner: ModelRunner, num_steps: int, topk: int, num_draft_tokens: int):
        self.runner, self.num_steps, self.topk, self.max_nodes = runner, num_steps, topk, num_draft_tokens
        self.seq: PagedSequence | None = None

    def start(self, prompt: list[int]) -> None:
        self.seq = self.runner.new_sequence()
        if len(prompt) > 1:
            self.runner.extend(self.seq, prompt[:-1])

    def finish(self) -> None:
        if self.seq is not None:
            self.seq.release()
            self.seq = None

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

    def propose(self, context: list[int]) -> DraftTree:
        seq, runner = self.seq, self.runner
        root_logits = runner.extend(seq, context[seq.length:])  # catch up on committed tokens, root last
        base = seq.length
        nodes: list[tuple] = []
        frontier = self._expand(root_logits, [-1], [0.0], nodes)
        expanded: list[int] = []
        for _ in range(self.num_steps - 1):
            expanded += frontier
            hidden = runner.forward(seq, torch.tensor([nodes[i][1] for i in expanded]),
                                    torch.tensor([nodes[i][2] - 1 for i in expanded]), self._mask(expanded, nodes))
            seq.truncate(base)
            rows = hidden[len(expanded) - len(frontier):]
            frontier = self._expand(runner.model.logits(rows), frontier, [nodes[i][0] for i in frontier], nodes)
        return self._select(context[-1], nodes)

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
