"""Drafter training data: target-regenerated responses stored compactly as token ids.

A :class:`TokenDataset` holds N sequences (prompt rendered with the chat template,
followed by the response the target itself generated) as one concatenated int32 token
array with offsets, the prompt length of each sequence and the name of the workload it
came from. No hidden states are stored: the trainer recomputes them from the frozen
target, so a data file stays small and is valid for any drafter architecture.

File format (``.safetensors``): tensors ``tokens`` int32 [total], ``offsets`` int64 [N+1],
``prompt_lens`` int32 [N], ``source_ids`` int32 [N]; the header metadata holds
``source_names`` (JSON list, indexed by ``source_ids``), ``format_version`` and a free
``info`` JSON dict (model, sampling, split, seed of the generation run).

:func:`make_batch` turns a few sequences into a right-padded [B, S] batch with the
response start of each row, truncating long sequences to a window that keeps the end of
the prompt (the first response tokens are the most valuable anchors).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dspark.training.interrupt import DeferredInterrupt

FORMAT_VERSION = "1"


class DataError(ValueError):
    """A training data file or its contents are invalid; the message names the value and the fix."""


@dataclass
class TokenDataset:
    """Concatenated token ids of N (prompt + response) sequences; see the module docstring."""

    tokens: torch.Tensor  # int32 [total]
    offsets: torch.Tensor  # int64 [N+1]
    prompt_lens: torch.Tensor  # int32 [N]
    source_ids: torch.Tensor  # int32 [N]
    source_names: list[str]
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens).to(torch.int32).reshape(-1)
        self.offsets = torch.as_tensor(self.offsets).to(torch.int64).reshape(-1)
        self.prompt_lens = torch.as_tensor(self.prompt_lens).to(torch.int32).reshape(-1)
        self.source_ids = torch.as_tensor(self.source_ids).to(torch.int32).reshape(-1)
        n = self.prompt_lens.numel()
        if self.offsets.numel() != n + 1:
            raise DataError(f"offsets has {self.offsets.numel()} entries, expected N+1 = {n + 1} for {n} sequences")
        if self.source_ids.numel() != n:
            raise DataError(f"source_ids has {self.source_ids.numel()} entries, expected one per sequence ({n})")
        if int(self.offsets[0]) != 0 or int(self.offsets[-1]) != self.tokens.numel():
            raise DataError(f"offsets must start at 0 and end at the token count {self.tokens.numel()}, got "
                            f"{int(self.offsets[0])} .. {int(self.offsets[-1])}")
        lengths = self.offsets[1:] - self.offsets[:-1]
        if n and bool((lengths < 2).any()):
            raise DataError("every sequence needs at least 2 tokens (a prompt token and a response token)")
        if n and bool(((self.prompt_lens < 1) | (self.prompt_lens.long() >= lengths)).any()):
            bad = int(torch.nonzero((self.prompt_lens < 1) | (self.prompt_lens.long() >= lengths))[0])
            raise DataError(f"sequence {bad}: prompt length {int(self.prompt_lens[bad])} must be in [1, "
                            f"{int(lengths[bad])}) so that at least one response token follows it")
        if n and (int(self.source_ids.min()) < 0 or int(self.source_ids.max()) >= len(self.source_names)):
            raise DataError(f"source_ids must index source_names ({len(self.source_names)} names), got range "
                            f"[{int(self.source_ids.min())}, {int(self.source_ids.max())}]")

    # ---------------------------------------------------------------- access

    def __len__(self) -> int:
        return int(self.prompt_lens.numel())

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def sequence(self, i: int) -> torch.Tensor:
        """Token ids of sequence i (prompt + response) as int64 [L]."""
        if not 0 <= i < len(self):
            raise IndexError(f"sequence index {i} out of range for {len(self)} sequences")
        return self.tokens[int(self.offsets[i]): int(self.offsets[i + 1])].long()

    def source(self, i: int) -> str:
        return self.source_names[int(self.source_ids[i])]

    def num_response_tokens(self) -> int:
        return int(self.tokens.numel() - self.prompt_lens.long().sum())

    def subset(self, indices: Sequence[int]) -> "TokenDataset":
        """A new dataset with the listed sequences, in that order."""
        seqs = [self.sequence(int(i)) for i in indices]
        return TokenDataset.from_sequences(seqs, [int(self.prompt_lens[int(i)]) for i in indices],
                                           [self.source(int(i)) for i in indices], info=dict(self.info))

    def split_holdout(self, fraction: float, seed: int = 0) -> tuple["TokenDataset", "TokenDataset"]:
        """(kept, held_out): a seeded random ``fraction`` of the sequences held out, at least one each."""
        if not 0.0 < fraction < 1.0:
            raise DataError(f"holdout fraction must be in (0, 1), got {fraction}")
        n = len(self)
        n_out = max(1, int(round(n * fraction)))
        if n_out >= n:
            raise DataError(f"cannot hold out {n_out} of {n} sequences and keep any for training; "
                            f"use more data or a smaller fraction")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
        return self.subset(sorted(perm[n_out:])), self.subset(sorted(perm[:n_out]))

    def summary(self) -> dict[str, Any]:
        lengths = (self.offsets[1:] - self.offsets[:-1]).long()
        per_source = {name: int((self.source_ids == k).sum()) for k, name in enumerate(self.source_names)}
        return {
            "sequences": len(self),
            "tokens": int(self.tokens.numel()),
            "response_tokens": self.num_response_tokens(),
            "mean_length": float(lengths.float().mean()) if len(self) else 0.0,
            "max_length": int(lengths.max()) if len(self) else 0,
            "per_source": per_source,
        }

    # ---------------------------------------------------------------- build / io

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int] | torch.Tensor], prompt_lens: Sequence[int],
                       sources: Sequence[str], info: dict[str, Any] | None = None) -> "TokenDataset":
        if not (len(sequences) == len(prompt_lens) == len(sources)):
            raise DataError(f"got {len(sequences)} sequences, {len(prompt_lens)} prompt lengths and {len(sources)} "
                            f"source names; they must pair up")
        names = sorted(set(sources))
        index = {name: k for k, name in enumerate(names)}
        flat = [torch.as_tensor(s, dtype=torch.int64).reshape(-1) for s in sequences]
        lengths = torch.tensor([t.numel() for t in flat], dtype=torch.int64)
        offsets = torch.zeros(len(flat) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        tokens = torch.cat(flat).to(torch.int32) if flat else torch.zeros(0, dtype=torch.int32)
        return cls(tokens, offsets, torch.tensor(list(prompt_lens), dtype=torch.int32),
                   torch.tensor([index[s] for s in sources], dtype=torch.int32), names, dict(info or {}))

    @classmethod
    def concat(cls, parts: Sequence["TokenDataset"], info: dict[str, Any] | None = None) -> "TokenDataset":
        """One dataset holding every sequence of ``parts`` in order (source names merged by name)."""
        if not parts:
            raise DataError("concat needs at least one dataset")
        names = sorted({name for part in parts for name in part.source_names})
        index = {name: k for k, name in enumerate(names)}
        ids = [torch.tensor([index[n] for n in part.source_names], dtype=torch.int32)[part.source_ids.long()]
               if len(part) else torch.zeros(0, dtype=torch.int32) for part in parts]
        lengths = torch.cat([(p.offsets[1:] - p.offsets[:-1]) for p in parts])
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        merged_info = dict(parts[0].info) if info is None else dict(info)
        if info is None and len(parts) > 1:
            merged_info["parts"] = [p.info for p in parts]
        return cls(torch.cat([p.tokens for p in parts]), offsets, torch.cat([p.prompt_lens for p in parts]),
                   torch.cat(ids), names, merged_info)

    @classmethod
    def load_many(cls, paths: str | Path | Sequence[str | Path]) -> "TokenDataset":
        """A data file, or several (e.g. shards written by parallel make_training_data runs) joined in order.
        ``paths``: a path, or any sequence of paths (a Hydra list config too)."""
        if isinstance(paths, (str, Path)):
            return cls.load(paths)
        paths = [str(p) for p in paths]
        if not paths:
            raise DataError("no training data files given")
        return cls.concat([cls.load(p) for p in paths]) if len(paths) > 1 else cls.load(paths[0])

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        if path.suffix != ".safetensors":
            raise DataError(f"training data path {str(path)!r} must end in .safetensors")
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"tokens": self.tokens.contiguous(), "offsets": self.offsets.contiguous(),
                   "prompt_lens": self.prompt_lens.contiguous(), "source_ids": self.source_ids.contiguous()}
        metadata = {"format_version": FORMAT_VERSION, "source_names": json.dumps(self.source_names),
                    "info": json.dumps(self.info)}
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata=metadata)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TokenDataset":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training data {str(path)!r} not found; make it with "
                                    f"`python -m runners.make_training_data output=PATH`")
        try:
            handle = safe_open(str(path), framework="pt")
        except (SafetensorError, OSError) as exc:
            raise DataError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc}; "
                            f"{path.stat().st_size} bytes): it is truncated or corrupt; regenerate it with "
                            f"runners.make_training_data") from None
        with handle as f:
            metadata = f.metadata() or {}
            if metadata.get("format_version") != FORMAT_VERSION:
                raise DataError(f"{path}: format_version {metadata.get('format_version')!r}, expected "
                                f"{FORMAT_VERSION!r}; regenerate it with runners.make_training_data")
            missing = {"tokens", "offsets", "prompt_lens", "source_ids"} - set(f.keys())
            if missing:
                raise DataError(f"{path}: missing tensors {sorted(missing)}; regenerate it with "
                                f"runners.make_training_data")
            tensors = {k: f.get_tensor(k) for k in ("tokens", "offsets", "prompt_lens", "source_ids")}
        return cls(**tensors, source_names=json.loads(metadata["source_names"]), info=json.loads(metadata["info"]))


class Batch(NamedTuple):
    """A right-padded batch of sequences."""

    input_ids: torch.Tensor  # int64 [B, S] (padding = pad_id)
    lengths: torch.Tensor  # int64 [B] real tokens per row
    response_starts: torch.Tensor  # int64 [B] index of the first response token within the row (>= 1)


def crop_window(length: int, prompt_len: int, max_len: int) -> int:
    """Start of the ``max_len`` window kept from a longer sequence.

    Keeps the last ``max_len // 4`` prompt tokens (context for the first response tokens)
    when the sequence is too long, never starting past ``length - max_len``.
    """
    if length <= max_len:
        return 0
    keep_context = max(1, max_len // 4)
    return max(0, min(prompt_len - keep_context, length - max_len))


def make_batch(dataset: TokenDataset, indices: Sequence[int], max_len: int, pad_id: int = 0) -> Batch:
    """Rows ``indices`` of ``dataset`` cropped to ``max_len`` (see :func:`crop_window`) and right-padded."""
    if max_len < 2:
        raise DataError(f"max_len must be >= 2, got {max_len}")
    rows, lengths, starts = [], [], []
    for i in indices:
        seq = dataset.sequence(int(i))
        p_len = int(dataset.prompt_lens[int(i)])
        start = crop_window(seq.numel(), p_len, max_len)
        seq = seq[start: start + max_len]
        rows.append(seq)
        lengths.append(seq.numel())
        starts.append(max(1, p_len - start))
    width = max(lengths)
    input_ids = torch.full((len(rows), width), int(pad_id), dtype=torch.int64)
    for r, seq in enumerate(rows):
        input_ids[r, : seq.numel()] = seq
    return Batch(input_ids, torch.tensor(lengths, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64))


def epoch_permutation(num_sequences: int, seed: int, epoch: int) -> torch.Tensor:
    """Shuffled order of the sequences for one epoch: a pure function of (seed, epoch)."""
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch)) & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randperm(num_sequences, generator=gen)


def bucketed_epoch_order(lengths: torch.Tensor, batch_size: int, bucket_batches: int, seed: int, epoch: int,
                         offset: int = 0) -> torch.Tensor:
    """Epoch ``epoch``'s order of the sequences with batches of similar length: a pure function of its arguments.

    The seeded epoch permutation is cut into chunks of ``bucket_batches`` x ``batch_size``
    sequences; each chunk is sorted by ``lengths`` [N] and its batch-sized groups are shuffled
    (seeded), so a batch is padded only to the length of sequences like its own and every
    sequence still comes once per epoch. ``offset`` positions at the start are left as they
    are: they complete a batch begun in the previous epoch, and the groups then line up with
    the batches.
    """
    n = int(lengths.numel())
    perm = epoch_permutation(n, seed, epoch)
    chunk = int(batch_size) * int(bucket_batches)
    gen = torch.Generator().manual_seed((int(seed) * 2_000_029 + int(epoch) * 7 + 3) & 0x7FFF_FFFF_FFFF_FFFF)
    pieces = [perm[:offset]]
    for lo in range(int(offset), n, chunk):
        part = perm[lo: lo + chunk]
        part = part[torch.argsort(lengths[part], stable=True)]
        groups = list(torch.split(part, int(batch_size)))
        pieces += [groups[int(k)] for k in torch.randperm(len(groups), generator=gen)]
    return torch.cat(pieces)


def batch_indices(num_sequences: int, batch_size: int, step: int, seed: int, lengths: torch.Tensor | None = None,
                  bucket_batches: int = 1, orders: dict[int, torch.Tensor] | None = None) -> list[int]:
    """Dataset rows of training step ``step`` (0-based): consecutive slices of seeded epoch orders.

    A pure function of its arguments, so a resumed run sees exactly the batches an
    uninterrupted run would. A batch may straddle an epoch boundary. The epoch order is
    :func:`epoch_permutation`, or with ``bucket_batches`` > 1 and ``lengths`` [N] (the length
    each sequence is trained at) :func:`bucketed_epoch_order`. ``orders`` ({epoch: order}),
    kept by a caller across the steps of one run (the same other arguments), saves computing
    an epoch's order again at every step.
    """
    if num_sequences < 1:
        raise DataError("the training data holds no sequences")
    if int(bucket_batches) < 1:
        raise DataError(f"bucket_batches must be >= 1 (1: no length bucketing), got {bucket_batches}")
    bucketed = int(bucket_batches) > 1
    if bucketed and (lengths is None or int(lengths.numel()) != num_sequences):
        raise DataError(f"length bucketing needs one length per sequence ({num_sequences}), got "
                        f"{None if lengths is None else int(lengths.numel())}")
    out: list[int] = []
    g = step * batch_size
    cache: dict[int, torch.Tensor] = {} if orders is None else orders
    for j in range(g, g + batch_size):
        epoch, pos = divmod(j, num_sequences)
        if epoch not in cache:
            if bucketed:
                offset = (-epoch * num_sequences) % batch_size
                cache[epoch] = bucketed_epoch_order(lengths, batch_size, bucket_batches, seed, epoch,
                                                    min(offset, num_sequences))
            else:
                cache[epoch] = epoch_permutation(num_sequences, seed, epoch)
        out.append(int(cache[epoch][pos]))
    return out


def trained_lengths(dataset: "TokenDataset", max_len: int) -> torch.Tensor:
    """int64 [N]: the length each sequence has in a batch (its length, at most ``max_len``)."""
    return (dataset.offsets[1:] - dataset.offsets[:-1]).clamp(max=int(max_len))


def generate_dataset(engine, items: Sequence[tuple[str, Any]], sampling: Sequence, *, info: dict[str, Any] | None = None,
                     progress: bool = True, time_budget_s: float | None = None,
                     in_flight: int | None = None, refill_at: int | None = None
                     ) -> tuple[TokenDataset, list[dict[str, Any]]]:
    """Regenerate responses with ``engine`` (target-only) for ``items`` = (source name, prompt) pairs.

    ``prompt`` is chat messages (rendered with the tokenizer's template) or token ids;
    ``sampling`` gives one SamplingParams per item. Requests enter the engine in waves: up to
    ``in_flight`` (default ``engine.cfg.max_num_seqs``) at once, and the next wave only when at
    most ``refill_at`` (default half of ``in_flight``) are unfinished. Topping the batch up
    whenever one request finished would put a prefill into nearly every step, and a step that
    mixes prefill with decode cannot replay a captured decode graph; in waves, most steps are
    pure decode. With ``time_budget_s``, no new prompt is admitted once the
    budget is spent; the requests already admitted finish and are kept, the rest are
    reported under ``info["not_admitted"]``. A Ctrl-C (SIGINT) ends the loop after the step
    in progress: the finished responses are returned, ``info["interrupted"]`` counts the
    admitted requests left unfinished (not in the data), and raising is the caller's part.
    Returns the dataset (in item order) and the
    failed items (``{"index", "source", "error"}``); failures are never dropped silently.
    """
    import time

    from dspark.engine import RequestError

    if len(items) != len(sampling):
        raise DataError(f"got {len(items)} prompts but {len(sampling)} sampling settings")
    limit = in_flight or int(engine.cfg.max_num_seqs)
    low = limit // 2 if refill_at is None else int(refill_at)
    if not 0 <= low < limit:
        raise DataError(f"refill_at must be in [0, in_flight={limit}), got {low}")
    t0 = time.perf_counter()
    outputs: dict[int, Any] = {}
    failed: list[dict[str, Any]] = []
    index_of: dict[int, int] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc="generate", unit="req")
    nxt = 0
    cut = False
    with DeferredInterrupt() as interrupt:  # a Ctrl-C ends the loop between steps, keeping what finished
        while (nxt < len(items) or engine.has_unfinished()) and not interrupt.requested:
            refill = len(index_of) <= low
            while refill and nxt < len(items) and len(index_of) < limit and not cut:
                if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                    cut = True
                    break
                source, prompt = items[nxt]
                try:
                    index_of[engine.add_request(prompt, sampling[nxt])] = nxt
                except RequestError as e:
                    failed.append({"index": nxt, "source": source, "error": str(e)})
                    if bar is not None:
                        bar.update(1)
                nxt += 1
            if cut and not engine.has_unfinished():
                break
            if not engine.has_unfinished():
                continue
            for out in engine.step():
                k = index_of.pop(out.req_id)
                outputs[k] = out
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    seqs, p_lens, sources = [], [], []
    for k in sorted(outputs):
        out = outputs[k]
        source = items[k][0]
        if out.error is not None or not out.token_ids:
            failed.append({"index": k, "source": source, "error": out.error or "no tokens generated"})
            continue
        seqs.append(list(out.prompt_token_ids) + list(out.token_ids))
        p_lens.append(len(out.prompt_token_ids))
        sources.append(source)
    failed.sort(key=lambda f: f["index"])
    info = dict(info or {})
    info["not_admitted"] = len(items) - nxt
    if interrupt.requested:  # admitted requests still running are left out; the caller says so and stops
        info["interrupted"] = {"unfinished": len(index_of)}
    info["generate_wall_s"] = round(time.perf_counter() - t0, 2)
    return TokenDataset.from_sequences(seqs, p_lens, sources, info=info), failed


__all__ = ["Batch", "DataError", "TokenDataset", "batch_indices", "bucketed_epoch_order", "crop_window",
           "epoch_permutation", "generate_dataset", "make_batch", "trained_lengths"]
