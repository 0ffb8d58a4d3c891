"""bench/loss_term_gradients.py: each loss term's gradient on each part of a drafter, with and without
train.conf_stop_grad."""

from __future__ import annotations

import pytest
import torch

from bench_scripts import load_bench_script
from dspark.training.data import TokenDataset
from tiny import tiny_drafter, tiny_target


def test_the_confidence_terms_backbone_gradient_is_zero_only_when_stopped():
    target = tiny_target()
    drafter = tiny_drafter(target)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 97, (30,), generator=gen).tolist() for _ in range(8)]
    data = TokenDataset.from_sequences(seqs, [4] * 8, ["s"] * 8, info={"split": "train"})
    script = load_bench_script("loss_term_gradients")
    kw = dict(batches=2, batch_size=4, max_len=32)
    through = script.term_gradients(drafter, target, data, **kw)
    stopped = script.term_gradients(drafter, target, data, conf_stop_grad=True, **kw)
    for result in (through, stopped):
        assert result["norms"]["ce"]["confidence_head"] == result["norms"]["tv"]["confidence_head"] == 0.0
        assert result["norms"]["conf"]["confidence_head"] > 0.0
        assert result["norms"]["tv"]["backbone"] > 0.0 and result["norms"]["ce"]["markov_head"] > 0.0
    assert through["norms"]["conf"]["backbone"] > 0.0 and through["norms"]["conf"]["markov_head"] > 0.0
    assert -1.0 <= through["conf_backbone_cosine"] <= 1.0
    assert stopped["norms"]["conf"]["backbone"] == stopped["norms"]["conf"]["markov_head"] == 0.0
    assert stopped["conf_backbone_cosine"] is None
    assert stopped["norms"]["conf"]["confidence_head"] == pytest.approx(through["norms"]["conf"]["confidence_head"])
    for argv in ([], ["out", "data=x", "batchs=2"], ["out"], ["out", "data=x", "conf_stop_grad=yes"]):
        with pytest.raises(SystemExit):
            script.main(argv)
    with pytest.raises(FileNotFoundError, match="make_training_data"):
        script.main(["out", "data=no/such/data.safetensors"])
