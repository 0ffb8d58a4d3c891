"""Tests of dspark.training.loss: each term against explicit loops, masking, detachment, weights."""

import math

import pytest
import torch

from dspark.training.loss import LossOutput, analytical_acceptance, dspark_loss, position_weights


def _softmax_list(row):
    m = max(row)
    e = [math.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


def _reference_terms(draft, target, conf, mask, labels, decay):
    """Plain-Python loops over [N][A][G][V] nested lists: (ce, tv, conf_bce, per-position acceptance)."""
    ce_sum = tv_sum = bce_sum = w_sum = 0.0
    n_pos = len(draft[0][0])
    acc_sum = [0.0] * n_pos
    acc_cnt = [0] * n_pos
    for n in range(len(draft)):
        for a in range(len(draft[n])):
            for k in range(n_pos):
                if not mask[n][a][k]:
                    continue
                w = math.exp(-k / decay)  # k is 0-based here: exp(-(k_1based - 1)/decay)
                p_d = _softmax_list(draft[n][a][k])
                p_t = _softmax_list(target[n][a][k])
                if labels is None:
                    ce = -sum(p_t[v] * math.log(p_d[v]) for v in range(len(p_d)))
                else:
                    ce = -math.log(p_d[labels[n][a][k]])
                l1 = sum(abs(p_d[v] - p_t[v]) for v in range(len(p_d)))
                alpha = sum(min(p_d[v], p_t[v]) for v in range(len(p_d)))
                c = 1.0 / (1.0 + math.exp(-conf[n][a][k]))
                bce = -(alpha * math.log(c) + (1 - alpha) * math.log(1 - c))
                ce_sum += w * ce
                tv_sum += w * l1
                bce_sum += w * bce
                w_sum += w
                acc_sum[k] += alpha
                acc_cnt[k] += 1
    acc = [acc_sum[k] / acc_cnt[k] if acc_cnt[k] else float("nan") for k in range(n_pos)]
    return ce_sum / w_sum, tv_sum / w_sum, bce_sum / w_sum, acc


def _tiny_case(seed=0):
    g = torch.Generator().manual_seed(seed)
    draft = torch.randn(2, 2, 2, 3, generator=g)  # N=2, A=2, G=2, V=3
    target = torch.randn(2, 2, 2, 3, generator=g)
    conf = torch.randn(2, 2, 2, generator=g)
    mask = torch.tensor([[[True, True], [True, False]], [[False, True], [True, True]]])
    labels = torch.randint(0, 3, (2, 2, 2), generator=g)
    return draft, target, conf, mask, labels


@pytest.mark.parametrize("use_labels", [True, False])
def test_terms_match_explicit_loops(use_labels):
    draft, target, conf, mask, labels = _tiny_case()
    out = dspark_loss(draft, target, conf, mask, targets=labels if use_labels else None, position_decay=4.0)
    ce, tv, bce, acc = _reference_terms(draft.tolist(), target.tolist(), conf.tolist(), mask.tolist(),
                                        labels.tolist() if use_labels else None, 4.0)
    assert isinstance(out, LossOutput)
    assert out.ce.item() == pytest.approx(ce, rel=1e-5)
    assert out.tv.item() == pytest.approx(tv, rel=1e-5)
    assert out.conf_bce.item() == pytest.approx(bce, rel=1e-5)
    assert out.total.item() == pytest.approx(0.1 * ce + 0.9 * tv + 1.0 * bce, rel=1e-5)
    assert out.per_position_acceptance.tolist() == pytest.approx(acc, rel=1e-5)
    assert out.per_position_count.tolist() == [3, 3]


def test_custom_term_weights_and_paper_decay():
    draft, target, conf, mask, labels = _tiny_case(1)
    out = dspark_loss(draft, target, conf, mask, targets=labels, ce_weight=0.5, tv_weight=0.25, conf_weight=2.0,
                      position_decay=None)
    ce, tv, bce, _ = _reference_terms(draft.tolist(), target.tolist(), conf.tolist(), mask.tolist(),
                                      labels.tolist(), 2.0)  # None -> decay = block size G = 2
    assert out.total.item() == pytest.approx(0.5 * ce + 0.25 * tv + 2.0 * bce, rel=1e-5)


def test_position_weights():
    w = position_weights(7, 4.0)
    assert w.tolist() == pytest.approx([math.exp(-(k - 1) / 4.0) for k in range(1, 8)], rel=1e-6)
    assert position_weights(5, None).tolist() == pytest.approx([math.exp(-k / 5.0) for k in range(5)], rel=1e-6)
    draft, target, conf, mask, labels = _tiny_case()
    assert dspark_loss(draft, target, conf, mask, targets=labels).weights.tolist() == pytest.approx(
        [1.0, math.exp(-0.25)], rel=1e-6)
    with pytest.raises(ValueError, match="position_decay"):
        position_weights(3, 0.0)


def test_position_weighting_emphasises_early_positions():
    # Position 1 has a large TV distance, position 2 none: the weighted mean must exceed the plain mean.
    draft = torch.tensor([[[[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]])
    target = torch.tensor([[[[0.0, 4.0, 0.0], [0.0, 0.0, 0.0]]]])
    mask = torch.ones(1, 1, 2, dtype=torch.bool)
    out = dspark_loss(draft, target, torch.zeros(1, 1, 2), mask)
    l1_first = (torch.softmax(draft[0, 0, 0], -1) - torch.softmax(target[0, 0, 0], -1)).abs().sum().item()
    w2 = math.exp(-0.25)
    assert out.tv.item() == pytest.approx(l1_first / (1.0 + w2), rel=1e-5)


def test_analytical_acceptance_is_sum_of_minimum():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 11, generator=g), torch.randn(5, 11, generator=g)
    expected = torch.minimum(torch.softmax(a, -1), torch.softmax(b, -1)).sum(-1)
    torch.testing.assert_close(analytical_acceptance(a, b), expected, rtol=1e-5, atol=1e-6)
    assert analytical_acceptance(a, a).tolist() == pytest.approx([1.0] * 5, abs=1e-6)


def test_confidence_target_is_detached():
    draft, target, conf, mask, labels = _tiny_case()
    draft = draft.clone().requires_grad_(True)
    conf = conf.clone().requires_grad_(True)
    out = dspark_loss(draft, target, conf, mask, targets=labels)
    (g_draft,) = torch.autograd.grad(out.conf_bce, draft, allow_unused=True, retain_graph=True)
    assert g_draft is None or torch.count_nonzero(g_draft) == 0
    (g_conf,) = torch.autograd.grad(out.conf_bce, conf)
    assert torch.count_nonzero(g_conf[mask]) == int(mask.sum())
    # The TV term, on the other hand, does train the draft logits.
    (g_tv,) = torch.autograd.grad(out.tv, draft)
    assert torch.count_nonzero(g_tv) > 0


def test_target_logits_receive_no_gradient():
    draft, target, conf, mask, labels = _tiny_case()
    draft = draft.clone().requires_grad_(True)
    target = target.clone().requires_grad_(True)
    out = dspark_loss(draft, target, conf, mask, targets=labels)
    (g,) = torch.autograd.grad(out.total, target, allow_unused=True)
    assert g is None or torch.count_nonzero(g) == 0


def test_masked_cells_do_not_contribute():
    draft, target, conf, mask, labels = _tiny_case()
    out = dspark_loss(draft, target, conf, mask, targets=labels)
    draft2, target2, conf2, labels2 = draft.clone(), target.clone(), conf.clone(), labels.clone()
    draft2[~mask] = 1e4 * torch.randn_like(draft2[~mask])
    target2[~mask] = float("nan")
    conf2[~mask] = -1e6
    labels2[~mask] = -100
    out2 = dspark_loss(draft2, target2, conf2, mask, targets=labels2)
    for a, b in zip(out, out2):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_bfloat16_inputs_are_upcast():
    draft, target, conf, mask, labels = _tiny_case()
    out32 = dspark_loss(draft.bfloat16().float(), target.bfloat16().float(), conf.bfloat16().float(), mask,
                        targets=labels)
    out16 = dspark_loss(draft.bfloat16(), target.bfloat16(), conf.bfloat16(), mask, targets=labels)
    assert out16.total.dtype == torch.float32
    torch.testing.assert_close(out16.total, out32.total)


def test_input_errors_are_clear():
    draft, target, conf, mask, labels = _tiny_case()
    with pytest.raises(ValueError, match="target_logits shape"):
        dspark_loss(draft, target[..., :2], conf, mask)
    with pytest.raises(ValueError, match="bool"):
        dspark_loss(draft, target, conf, mask.float())
    with pytest.raises(ValueError, match="no cell"):
        dspark_loss(draft, target, conf, torch.zeros_like(mask))
    bad = labels.clone()
    bad[0, 0, 0] = 3
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        dspark_loss(draft, target, conf, mask, targets=bad)
    with pytest.raises(ValueError, match="tv_weight"):
        dspark_loss(draft, target, conf, mask, tv_weight=-1.0)


def test_without_confidence_head():
    draft, target, conf, mask, labels = _tiny_case()
    out = dspark_loss(draft, target, None, mask, targets=labels)
    assert out.conf_bce.item() == 0.0
    assert out.total.item() == pytest.approx(0.1 * out.ce.item() + 0.9 * out.tv.item(), rel=1e-6)


def test_loss_decreases_under_sgd():
    torch.manual_seed(0)
    n, a, g_, v, d = 4, 3, 4, 16, 8
    features = torch.randn(n, a, g_, d)
    target_logits = features @ torch.randn(d, v)
    labels = torch.distributions.Categorical(logits=target_logits).sample()
    mask = torch.rand(n, a, g_) > 0.2
    draft_head = torch.nn.Linear(d, v)
    conf_head = torch.nn.Linear(d, 1)
    opt = torch.optim.SGD(list(draft_head.parameters()) + list(conf_head.parameters()), lr=0.5)
    losses, acceptance = [], []
    for _ in range(30):
        out = dspark_loss(draft_head(features), target_logits, conf_head(features).squeeze(-1), mask, targets=labels)
        opt.zero_grad()
        out.total.backward()
        opt.step()
        losses.append(out.total.item())
        acceptance.append(out.per_position_acceptance.mean().item())
    assert losses[-1] < 0.8 * losses[0]
    assert acceptance[-1] > acceptance[0] + 0.05


def test_the_greedy_confidence_label_is_whether_the_top_tokens_agree():
    """conf_target="greedy": each cell's label is 1[argmax p_d = argmax p_t] (what T=0 verification accepts), the
    BCE over the same weighted cells; the other terms and the reported acceptance (c*_k) do not change."""
    draft, target, conf, mask, labels = _tiny_case(3)
    target[0, 0, 0] = draft[0, 0, 0] + 0.1  # one cell whose top tokens certainly agree
    analytical = dspark_loss(draft, target, conf, mask, targets=labels)
    greedy = dspark_loss(draft, target, conf, mask, targets=labels, conf_target="greedy")
    agree = (draft.argmax(-1) == target.argmax(-1)).float()
    assert bool(agree[mask].min() == 0) and bool(agree[mask].max() == 1)  # both kinds of label occur
    w = position_weights(2)[torch.arange(2).expand(mask.shape)[mask]]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(conf[mask], agree[mask], reduction="none")
    assert greedy.conf_bce.item() == pytest.approx(float((w * bce).sum() / w.sum()), rel=1e-6)
    assert greedy.conf_bce.item() != pytest.approx(analytical.conf_bce.item(), rel=1e-3)
    for name in ("ce", "tv"):
        assert getattr(greedy, name).item() == getattr(analytical, name).item()
    assert torch.equal(greedy.per_position_acceptance, analytical.per_position_acceptance)
    with pytest.raises(ValueError, match="conf_target must be one of"):
        dspark_loss(draft, target, conf, mask, conf_target="sampled")
