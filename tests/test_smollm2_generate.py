"""On the real SmolLM2 in fp32: the engine's greedy generation equals transformers' greedy
``generate`` for 64 tokens, target-only and speculative with the shipped drafter."""

from pathlib import Path

import pytest
import torch

from dspark.config import EngineConfig, SamplingParams
from dspark.engine import Engine
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel
from dspark.models.loading import load_hf_folder, prepare_smollm2
from test_gguf_convert import SMOLLM2_CACHE

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.smollm2

PROMPTS = [
    [{"role": "user", "content": "Write a haiku about autumn rain on a tin roof."}],
    [{"role": "user", "content": "Explain what a hash table is in three sentences."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List three prime numbers."}],
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    folder = prepare_smollm2(tmp_path_factory.getbasetemp() / SMOLLM2_CACHE)
    cfg, state, tokenizer = load_hf_folder(folder)
    target = TargetModel(cfg)
    target.load_hf_state_dict(state)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ref.generation_config.eos_token_id = None  # like ignore_eos: run the full 64 tokens through any EOS
    return target, tokenizer, ref


def test_greedy_generation_matches_transformers_for_64_tokens(smollm2):
    target, tokenizer, ref = smollm2
    ids = [tokenizer.encode_chat(m) for m in PROMPTS]
    # transformers generates the three prompts in one batch, left-padded with their attention mask (the padding
    # is masked out and each prompt's positions count from its first token): a third of the forward passes.
    width = max(map(len, ids))
    padded = torch.tensor([[0] * (width - len(p)) + p for p in ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    with torch.no_grad():
        out = ref.generate(padded, attention_mask=mask, max_new_tokens=64, do_sample=False, pad_token_id=0)
    want = [row[width:].tolist() for row in out]
    assert all(len(w) == 64 for w in want)
    sp = SamplingParams(max_tokens=64, ignore_eos=True)
    plain = Engine(target, tokenizer, EngineConfig(spec="off", kv_cache_tokens=4096, max_num_seqs=4)).generate(ids, sp)
    assert [o.token_ids for o in plain] == want
    drafter = DSparkDrafter.load(Path(__file__).resolve().parents[1] / "dspark" / "assets" / "dspark-smollm2", target.cfg)
    spec = Engine(target, tokenizer, EngineConfig(spec="dspark", kv_cache_tokens=4096, max_num_seqs=4),
                  drafter).generate(ids, sp)
    assert [o.token_ids for o in spec] == want
    assert any(a > 1 for o in spec for a in o.accept_lengths), "the shipped drafter never got a draft accepted"
