"""Tiny random models for fast CPU tests."""

from __future__ import annotations

import copy

import torch

from dspark.config import DrafterConfig, EngineConfig, ModelConfig
from dspark.models.llama import TargetModel


def tiny_model_config(arch: str = "llama", vocab: int = 97, **kw) -> ModelConfig:
    base = dict(arch=arch, vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
                tie_word_embeddings=True, attention_bias=(arch == "qwen2"), qk_norm=(arch == "qwen3"),
                bos_token_id=1, eos_token_ids=(2,))
    base.update(kw)
    return ModelConfig(**base)


def tiny_target(seed: int = 0, arch: str = "llama", scale: float = 1.0, **kw) -> TargetModel:
    """A random target whose logits are peaked enough that greedy decoding has no near-ties."""
    torch.manual_seed(seed)
    model = TargetModel(tiny_model_config(arch, **kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08 * scale if "embed" not in name else 1.0)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model.eval()


def paged_logits(model: TargetModel, seqs: list[list[int]], chunk, kernels=None, page: int = 8) -> list[torch.Tensor]:
    """Each sequence through the paged cache, all requests packed into every step, and the float32 logits of every
    token, per sequence. ``chunk``: tokens per step, one int for all sequences or one entry per sequence (an int, or
    a list of sizes taken in turn, step by step); ``kernels``: the steps' KernelConfig (None: the defaults)."""
    from dspark.attention import AttentionMetadata
    from dspark.kv_cache import BlockManager, KVCache

    cfg = model.cfg
    sizes = [c if isinstance(c, list) else [c] for c in (chunk if isinstance(chunk, list) else [chunk] * len(seqs))]
    pages = sum(-(-len(s) // page) for s in seqs) + 1
    blocks = BlockManager(pages, page)
    cache = KVCache(cfg.num_layers, pages, page, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    done, steps = [0] * len(seqs), [0] * len(seqs)
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    while any(d < len(s) for d, s in zip(done, seqs)):
        ids, pos, slots, indptr, lens, tables, owners = [], [], [], [0], [], [], []
        for r, s in enumerate(seqs):
            if done[r] >= len(s):
                continue
            n = min(sizes[r][steps[r] % len(sizes[r])], len(s) - done[r])
            steps[r] += 1
            blocks.reserve(r, done[r] + n)
            ids += s[done[r]: done[r] + n]
            pos += list(range(done[r], done[r] + n))
            slots += [blocks.slot(r, p) for p in range(done[r], done[r] + n)]
            indptr.append(indptr[-1] + n)
            lens.append(done[r] + n)
            tables.append(blocks.table(r))
            owners.append((r, n))
            done[r] += n
        bt = torch.zeros(len(tables), max(len(t) for t in tables), dtype=torch.int32)
        for i, t in enumerate(tables):
            bt[i, : len(t)] = torch.tensor(t)
        meta = AttentionMetadata(torch.tensor(indptr, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32), bt,
                                 torch.tensor(slots, dtype=torch.int64), kernels=kernels)
        with torch.no_grad():
            h, _ = model(torch.tensor(ids), torch.tensor(pos), cache, meta)
            logits = model.compute_logits(h, kernels)
        for i, (r, n) in enumerate(owners):
            out[r].append(logits[indptr[i]: indptr[i] + n])
    return [torch.cat(o) for o in out]


def tiny_drafter(target: TargetModel, seed: int = 1, **kw):
    from dspark.models.drafter import DSparkDrafter

    base = dict(block_size=4, num_layers=1, target_layer_ids=(0, 2), markov_rank=8, markov_variant="vanilla")
    base.update(kw)
    torch.manual_seed(seed)
    d = DSparkDrafter(target.cfg, DrafterConfig(**base))
    with torch.no_grad():
        for name, p in d.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    return d.eval()


def tiny_engine_config(**kw) -> EngineConfig:
    # plan_min_rows=0: tiny engines run a few rows, and their tests exercise the planner there
    base = dict(device="cpu", dtype="float32", kv_block_size=8, max_model_len=256, max_num_seqs=8,
                max_num_batched_tokens=64, spec="dspark", plan_min_rows=0)
    base.update(kw)
    return EngineConfig(**base)


def random_prompts(seed: int, n: int, lo: int = 1, hi: int = 30) -> list[list[int]]:
    """``n`` prompts of lo..hi-1 random token ids (3..96: no BOS/EOS), seeded."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, 97, (L,), generator=g).tolist() for L in lens]


_TRAINED: dict[tuple, tuple[TargetModel, object]] = {}


def trained_tiny_pair(seed: int = 0, scale: float = 2.0, steps: int = 120, **drafter_kw):
    """(target, drafter): a tiny target whose greedy outputs vary (``scale`` 2), and a drafter trained ``steps``
    steps on that target's greedy answers to random prompts, so that a speculative run rejects some drafts and
    accepts others up to whole blocks (a random drafter against a random target accepts almost nothing, and a
    target at scale 1 repeats one token: equality tests on either exercise little). Trained once per process;
    each call returns its own copy."""
    key = (seed, scale, steps, tuple(sorted(drafter_kw.items())))
    if key not in _TRAINED:
        import tempfile

        from dspark.config import SamplingParams
        from dspark.engine import Engine
        from dspark.training.data import TokenDataset
        from dspark.training.trainer import DrafterTrainer

        target = tiny_target(seed, scale=scale)
        outs = Engine(target, None, tiny_engine_config(spec="off", max_num_seqs=16)).generate(
            random_prompts(100 + seed, 48), SamplingParams(max_tokens=28, ignore_eos=True))
        data = TokenDataset.from_sequences([o.prompt_token_ids + o.token_ids for o in outs],
                                           [len(o.prompt_token_ids) for o in outs], ["tiny"] * len(outs), info={})
        drafter = tiny_drafter(target, seed + 10, **drafter_kw)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small matmuls: one thread is faster, and xdist workers share the cores
        try:
            with tempfile.TemporaryDirectory() as out:
                DrafterTrainer(target, drafter, data, _train_config(out, steps)).train()
        finally:
            torch.set_num_threads(threads)
        _TRAINED[key] = (target, drafter.eval())
    return copy.deepcopy(_TRAINED[key])  # each caller its own models: a test may change its drafter's calibration


def _train_config(output_dir: str, steps: int):
    from dspark.training.trainer import TrainConfig

    return TrainConfig(output_dir=output_dir, max_steps=steps, batch_size=8, max_len=64, anchors_per_seq=6, lr=1e-2,
                       warmup_steps=4, save_every=10_000, log_every=10_000, progress=False, seed=0)
