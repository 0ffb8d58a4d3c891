"""Teacher-forced re-scoring of an arm's outputs by a float32 reference of the target.

The lossless guard (dspark/bench/lossless.py) needs, at every position an arm emitted a greedy
token, what the target "really" prefers there, free of the rounding of a reduced-precision
engine. :class:`ReferenceScorer` keeps a float32 copy of the engine's target (the
*reference*) next to the engine's own-precision weights and runs one teacher-forced forward
per (prompt, output) with each:

- from the reference: the top-k tokens and logits at each output position, and the logit of
  the token the arm emitted there; the emitted token's *regret* is the reference's top logit
  minus its own (0 when the arm emitted the reference's argmax);
- from the engine's precision, the *forward noise* at each position: how far the
  reduced-precision logit differences between the reference's top token and its runners-up
  are from the float32 ones. A rounding flip can only choose a token whose regret is within
  that kind of error, so its distribution over thousands of positions measures how large an
  innocent regret can be.

Row i of a sequence's logits sits after prompt + output[:i], the arm's own prefix, so every
position is checked, not only the first one where two arms part.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from dspark.model_runner import packed_hidden


@dataclass
class ScoredOutput:
    """One output re-scored by the reference (arrays of length n = len(output))."""

    tokens: np.ndarray  # int64 [n], the arm's tokens
    top_tokens: np.ndarray  # int64 [n, k], the reference's best k tokens at each position, best first
    top_logits: np.ndarray  # float32 [n, k]
    token_logits: np.ndarray  # float32 [n], the reference's logit of the arm's token
    noise: np.ndarray | None  # float32 [n], max forward noise of the top-token logit differences (None in fp32)

    @property
    def regret(self) -> np.ndarray:
        """Reference top logit minus the logit of the token the arm emitted (>= 0)."""
        return np.maximum(self.top_logits[:, 0] - self.token_logits, 0.0)

    @property
    def off_reference(self) -> np.ndarray:
        """Positions where the arm did not emit the reference's argmax."""
        return self.tokens != self.top_tokens[:, 0]


class ReferenceScorer:
    """Re-scores outputs of engines built on ``target`` (any precision) against a float32 copy of it.

    ``top_k``: reference tokens kept per position; ``noise_k``: runners-up whose logit difference
    to the top token enters the forward-noise measure. Outputs are scored packed, up to
    ``max_batch_tokens`` tokens per forward and ``chunk_rows`` logit rows at a time. Scores are
    cached per (prompt, output), so outputs repeated across blocks and arms are scored once.
    """

    def __init__(self, target: torch.nn.Module, *, top_k: int = 16, noise_k: int = 8, max_batch_tokens: int = 16384,
                 chunk_rows: int = 4096):
        self.engine_model = target
        self.dtype = next(target.parameters()).dtype
        self._reference = target if self.dtype == torch.float32 else None
        self.top_k, self.noise_k = top_k, noise_k
        self.max_batch_tokens, self.chunk_rows = max_batch_tokens, chunk_rows
        self._cache: dict[tuple[tuple[int, ...], tuple[int, ...]], ScoredOutput] = {}

    @property
    def reduced_precision(self) -> bool:
        return self.dtype != torch.float32

    @property
    def reference(self) -> torch.nn.Module:
        """The float32 copy of the target, made on first use (the engine's own model in float32)."""
        if self._reference is None:
            self._reference = copy.deepcopy(self.engine_model).float()
        return self._reference

    def logits(self, prompt_ids: list[int], output_ids: list[int], *, reference: bool = True) -> torch.Tensor:
        """Float32 logits [len(output), V] at each output position (row i after prompt + output[:i])."""
        return next(self.iter_logits([(prompt_ids, output_ids)], reference=reference))[1]

    def _batches(self, items: list[tuple]) -> Iterator[list[int]]:
        """Indices of ``items`` ((prompt, output) pairs) in order, grouped into packed forwards of at most
        ``max_batch_tokens`` tokens (one item alone when it is longer)."""
        batch: list[int] = []
        size = 0
        for i, (p, o) in enumerate(items):
            if not p or not o:
                raise ValueError("ReferenceScorer: need a non-empty prompt and output")
            n = len(p) + len(o) - 1
            if batch and size + n > self.max_batch_tokens:
                yield batch
                batch, size = [], 0
            batch.append(i)
            size += n
        if batch:
            yield batch

    @staticmethod
    def _output_rows(model: torch.nn.Module, batch: list[tuple]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One packed teacher-forced forward of ``model`` over ``batch``'s (prompt, output[:-1]) sequences:
        (final hidden states, each item's rows at its output positions)."""
        hidden, offsets = packed_hidden(model, [list(p) + list(o[:-1]) for p, o in batch])
        rows = [off + len(p) - 1 + torch.arange(len(o), device=hidden.device) for (p, o), off in zip(batch, offsets)]
        return hidden, rows

    def iter_logits(self, items: list[tuple[list[int], list[int]]], *, reference: bool = True
                    ) -> Iterator[tuple[int, torch.Tensor]]:
        """:meth:`logits` of each (prompt, output) in order, computed in packed forwards of at most
        ``max_batch_tokens`` tokens: yields (index, float32 logits [len(output), V])."""
        model = self.reference if reference else self.engine_model
        for batch in self._batches(items):
            with torch.inference_mode():
                hidden, rows = self._output_rows(model, [items[i] for i in batch])
                for i, r in zip(batch, rows):
                    yield i, model.compute_logits(hidden[r]).float()

    def score(self, prompt_ids: list[int], output_ids: list[int]) -> ScoredOutput:
        return self.score_many([(prompt_ids, output_ids)])[0]

    def score_many(self, items: list[tuple[list[int], list[int]]], progress: Callable | None = None
                   ) -> list[ScoredOutput]:
        """:meth:`score` of every (prompt, output), packed into forwards of at most ``max_batch_tokens``
        tokens each; ``progress(n)`` is called with the number of outputs each forward scored."""
        keys = [(tuple(p), tuple(o)) for p, o in items]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        for batch in self._batches(todo):
            self._score_batch([todo[i] for i in batch])
            if progress is not None:
                progress(len(batch))
        return [self._cache[k] for k in keys]

    @torch.inference_mode()
    def _score_batch(self, batch: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
        hidden, item_rows = self._output_rows(self.reference, batch)
        dev = hidden.device
        rows = torch.cat(item_rows)
        toks = torch.tensor([t for _, o in batch for t in o], dtype=torch.int64, device=dev)
        k = min(self.top_k, self.reference.cfg.vocab_size)
        top_v, top_i, tok_l = [], [], []
        for h, t in zip(hidden[rows].split(self.chunk_rows), toks.split(self.chunk_rows)):
            logits = self.reference.compute_logits(h).float()
            v, i = logits.topk(k, dim=-1)
            top_v.append(v)
            top_i.append(i)
            tok_l.append(logits.gather(1, t[:, None])[:, 0])
        top_v, top_i, tok_l = torch.cat(top_v), torch.cat(top_i), torch.cat(tok_l)
        noise = None
        if self.reduced_precision:
            low_hidden, _ = self._output_rows(self.engine_model, batch)
            nk = min(self.noise_k, k)
            parts = []
            for h, idx, v in zip(low_hidden[rows].split(self.chunk_rows), top_i[:, :nk].split(self.chunk_rows),
                                 top_v[:, :nk].split(self.chunk_rows)):
                lo = self.engine_model.compute_logits(h).float().gather(1, idx)
                err = ((lo[:, :1] - lo) - (v[:, :1] - v)).abs()[:, 1:]
                parts.append(err.amax(dim=1) if err.shape[1] else torch.zeros(len(h), device=dev))
            noise = torch.cat(parts).cpu().numpy().astype(np.float32)
        top_v, top_i, tok_l = top_v.cpu().numpy().astype(np.float32), top_i.cpu().numpy(), tok_l.cpu().numpy()
        toks_np = toks.cpu().numpy()
        at = 0
        for key in batch:
            n = len(key[1])
            sl = slice(at, at + n)
            self._cache[key] = ScoredOutput(tokens=toks_np[sl], top_tokens=top_i[sl], top_logits=top_v[sl],
                                            token_logits=tok_l[sl], noise=None if noise is None else noise[sl])
            at += n


def float64_token_gaps(target: torch.nn.Module, cases: list[tuple[list[int], list[int], int, int]]
                       ) -> list[dict[str, float | str]]:
    """Where two greedy runs parted: for each (prompt, shared prefix, token a, token b), the logits a float64 copy
    of ``target`` gives the two tokens after prompt + prefix, as ``float64_gap`` (|a - b|) and ``float64_prefers``
    ("a" or "b"). The logits come out of the float64 forward rounded to float32, which resolves gaps above about
    1e-6 at the logit sizes of a language model's top tokens. A gap within a float32 forward's rounding (about 1e-4
    for SmolLM2) says two forwards met a near-tie; a large one says a run emitted a token the target does not
    choose. The copy is made once per call, only when ``cases`` is not empty."""
    from dspark.model_runner import last_position_logits

    if not cases:
        return []
    model = copy.deepcopy(target).to(torch.float64)
    found = []
    with torch.inference_mode():
        for prompt, prefix, a, b in cases:
            logits = last_position_logits(model, list(prompt) + list(prefix))
            la, lb = float(logits[a]), float(logits[b])
            found.append({"float64_gap": abs(la - lb), "float64_prefers": "a" if la > lb else "b"})
    return found
