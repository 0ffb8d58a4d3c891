"""The engine on CUDA: same guarantees as on the CPU (run on the H200; CI has no GPU)."""

import dataclasses

import pytest
import torch

from dspark.config import SamplingParams
from dspark.engine import Engine
from test_engine_lossless import prompts_for
from test_engine_scheduling import steep_table
from tiny import tiny_drafter, tiny_engine_config, tiny_target

pytestmark = pytest.mark.gpu

MODES = [("full", {}), ("uniform", {}), ("ragged", {"token_buckets": (32, 64, 128, 256)}), ("cap_accept", {})]


def cuda_engine(target, drafter, **kw):
    cfg = tiny_engine_config(device="cuda", kv_block_size=16, attention_backend="triton", **kw)
    return Engine(target, None, cfg, drafter)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("verify,extra", MODES)
def test_cuda_greedy_spec_equals_target_only(tmp_path, dtype, verify, extra):
    target = tiny_target(31)
    drafter = tiny_drafter(target, 32, block_size=4)
    prompts = prompts_for(31, 8, lo=2, hi=60)
    sp = SamplingParams(max_tokens=32, ignore_eos=True)
    base = cuda_engine(target, None, spec="off", dtype=dtype).generate(prompts, sp)
    table = None
    if verify != "full":
        probe = cuda_engine(target, drafter, dtype=dtype)
        table = steep_table(probe, tmp_path / "t.json")
    eng = cuda_engine(target, drafter, dtype=dtype, verify=verify, cost_table=table, debug_checks=True, **extra)
    out = eng.generate(prompts, sp)
    same = sum(o.token_ids == b.token_ids for o, b in zip(out, base))
    if dtype == "float32":
        assert same == len(prompts)
    else:  # bf16: a different batch layout may flip a near-tie; most requests must still agree exactly
        assert same >= len(prompts) - 2, same
    if verify != "full":
        assert eng.counters()["trimmed_steps"] > 0


def test_cuda_matches_cpu_in_fp32():
    target = tiny_target(33)
    drafter = tiny_drafter(target, 34, block_size=4)
    prompts = prompts_for(33, 4)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    cpu = Engine(target, None, tiny_engine_config(), drafter).generate(prompts, sp)
    gpu = cuda_engine(tiny_target(33), tiny_drafter(tiny_target(33), 34, block_size=4)).generate(prompts, sp)
    assert [o.token_ids for o in gpu] == [o.token_ids for o in cpu]


def test_cuda_sampling_runs_and_respects_max_tokens():
    target = tiny_target(35)
    drafter = tiny_drafter(target, 36, block_size=4)
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_tokens=20, ignore_eos=True)
    out = cuda_engine(target, drafter, dtype="bfloat16").generate(prompts_for(35, 16), sp)
    assert all(len(o.token_ids) == 20 and o.error is None for o in out)


# ---- device-resident steps: CUDA graphs keyed by token bucket, overlap, no host syncs -------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec", ["off", "dspark"])
def test_cuda_graph_steps_emit_what_eager_steps_emit(dtype, spec):
    target = tiny_target(41)
    drafter = tiny_drafter(target, 42, block_size=4) if spec == "dspark" else None
    prompts = prompts_for(41, 11, lo=2, hi=60)
    params = [SamplingParams(max_tokens=16 + 7 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    kw = dict(spec=spec, dtype=dtype, max_num_seqs=8)
    base = [o.token_ids for o in cuda_engine(target, drafter, **kw).generate(prompts, params)]
    for overlap in (False, True):
        eng = cuda_engine(target, drafter, cuda_graphs=True, overlap=overlap, **kw)
        out = [o.token_ids for o in eng.generate(prompts, params)]
        same = sum(a == b for a, b in zip(out, base))
        assert same == len(prompts) if dtype == "float32" else same >= len(prompts) - 2, (overlap, same)
        c = eng.counters()
        assert c["graph_replays"] > 0 and c["graph_eager_steps"] == 0
        # One decode graph per token bucket used, never per (bucket x anything else); the prefills ran
        # as graphs too (keyed by token and chunk buckets), so no step left the device-resident path.
        step_graphs = [k for k in eng.graph.graphs if k[0] == "step"]
        assert c["graphs_captured"] == len(eng.graph.graphs) and len(step_graphs) <= len(eng.graph.buckets)
        assert c["prefill_graph_replays"] > 0 and c["eager_steps"] == 0 and c["device_resident_share"] == 1.0


def serve_without_syncs(eng, prompts, params) -> list[list[int]]:
    """Every request added at once and served to the end with any host sync raising; the outputs' tokens in
    request order."""
    for p, sp in zip(prompts, params):
        eng.add_request(p, sp)
    outs = {}
    torch.cuda.set_sync_debug_mode("error")
    try:
        while eng.has_unfinished():
            for o in eng.step():
                outs[o.req_id] = o.token_ids
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [outs[i] for i in sorted(outs)]


@pytest.mark.parametrize("prefill_stream", [True, False])
@pytest.mark.parametrize("spec,verify", [("off", "full"), ("dspark", "full"), ("dspark", "ragged")])
def test_continuous_batching_stays_device_resident_without_captures_or_syncs(tmp_path, spec, verify, prefill_stream):
    """Service: more requests than rows, so requests are admitted, prefilled (some in several chunks),
    join the running batch and retire from it while the pipeline runs. With every graph captured ahead
    (Engine.capture_graphs), no step is eager, nothing is captured during the run, the host never
    syncs outside the one wait per step, and the outputs are the eager engine's, with prefills on their
    own stream beside the decode steps (engine.prefill_stream) or on the decode steps' stream."""
    target = tiny_target(49)
    drafter = tiny_drafter(target, 50, block_size=4) if spec == "dspark" else None
    prompts = prompts_for(49, 24, lo=2, hi=150)  # some longer than the 128-token prefill budget: chunked
    params = [SamplingParams(max_tokens=20 + 9 * (i % 4), ignore_eos=True) for i in range(len(prompts))]
    kw = dict(max_num_seqs=8, max_model_len=480, max_num_batched_tokens=128)
    base = [o.token_ids for o in cuda_engine(target, drafter, spec=spec, **kw).generate(prompts, params)]
    eng = graph_engine(tmp_path, target, drafter, spec, verify, overlap=True, budget_lag=2,
                       prefill_stream=prefill_stream, **kw)
    assert eng.capture_graphs(params) > 0
    assert serve_without_syncs(eng, prompts, params) == base
    c = eng.counters()
    assert c["graphs_captured"] == 0 and c["eager_steps"] == 0 and c["device_resident_share"] == 1.0
    assert c["prefill_graph_replays"] > 0 and c["mixed_steps"] > 0
    assert (c["prefill_side_stream_replays"] > 0) == prefill_stream
    assert (eng.fingerprint().get("prefill_path") == "side-stream") == prefill_stream



def test_prefill_graphs_never_share_a_capture_stream_with_the_decode_graphs(tmp_path):
    """cuBLAS keys its workspace by stream, so a prefill graph captured on the stream torch captures the decode
    graphs on would share their workspace with the decode step it runs beside. torch hands out streams
    round-robin from a pool per priority, so whether a default-priority stream is that one depends on how
    many streams the process made before; the prefill capture stream comes from the other priority's pool."""
    target = tiny_target(49)
    drafter = tiny_drafter(target, 50, block_size=4)
    torch.cuda.graph(torch.cuda.CUDAGraph())  # constructing one creates torch's default capture stream
    decode_stream = torch.cuda.graph.default_capture_stream
    for k in range(40):  # streams handed out round-robin: walk the pool through every position
        for _ in range(1 + k % 2):
            torch.cuda.Stream()
        eng = graph_engine(tmp_path, target, drafter, "dspark", "full", overlap=True, budget_lag=2,
                           prefill_stream=True, max_num_seqs=4)
        capture = eng.graph._prefill_capture_stream
        assert capture.cuda_stream != decode_stream.cuda_stream and capture.priority != decode_stream.priority
        del eng


DEPTH_ZERO = [("full", dict(draft_free_steps=True)), ("ragged", dict(draft_free_steps=True)),
              ("ragged", dict(min_verify_len=0)),
              ("ragged", dict(min_verify_len=0, draft_free_steps=True, service_cost=True))]


@pytest.mark.parametrize("verify,extra", DEPTH_ZERO)
def test_steps_and_rows_without_drafts_replay_captured_graphs_and_emit_target_only_tokens(tmp_path, verify, extra):
    """Depth zero on the device path: draft-free steps (engine.draft_free_steps; their verify graphs captured
    ahead with the others) and drafted rows that verify no draft (engine.min_verify_len=0) run without
    captures or host syncs, and the greedy outputs (fp32) are the target-only engine's."""
    target = tiny_target(49)
    drafter = tiny_drafter(target, 50, block_size=4)
    prompts = prompts_for(49, 40, lo=2, hi=150)
    params = [SamplingParams(max_tokens=20 + 9 * (i % 4), ignore_eos=True) for i in range(len(prompts))]
    kw = dict(max_num_seqs=16, max_model_len=480, max_num_batched_tokens=256)
    base = [o.token_ids for o in cuda_engine(target, None, spec="off", **kw).generate(prompts, params)]
    eng = graph_engine(tmp_path, target, drafter, "dspark", verify, overlap=True, budget_lag=2, **extra, **kw)
    assert eng.capture_graphs(params) > 0
    free = extra.get("draft_free_steps", False)
    assert any(k[0] == "verify" and k[2] == "draft_free" for k in eng.graph.graphs) == free
    out = serve_without_syncs(eng, prompts, params)
    assert sum(o == b for o, b in zip(out, base)) == len(prompts)
    c = eng.counters()
    assert c["graphs_captured"] == 0 and c["eager_steps"] == 0
    if free:
        assert 0 < c["draft_free_steps"] < c["decode_steps"]
    if extra.get("min_verify_len") == 0:
        assert c["depth_zero_rows"] > 0


GRAPH_MODES = [("off", "full"), ("dspark", "full"), ("dspark", "uniform"), ("dspark", "ragged")]


def run_steady_steps_without_sync(eng, warm: int, steps: int) -> None:
    """Warm up (prefill, every capture this batch can use, page-table updates), then run
    ``steps`` steady steps with any host sync raising; all must replay graphs, none capture."""
    for _ in range(warm):
        eng.step()
    replays = eng.counters()["graph_replays"]
    captured = eng.graph.captures
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            eng.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert eng.counters()["graph_replays"] > replays and eng.graph.captures == captured


def graph_engine(tmp_path, target, drafter, spec, verify, **kw):
    table = None
    if verify != "full":
        probe = cuda_engine(target, drafter, cuda_graphs=True, overlap=kw.get("overlap", False),
                            budget_lag=kw.get("budget_lag", 1), dtype=kw.get("dtype", "float32"),
                            kernels=kw.get("kernels", {}))  # (the table records the kernels in effect)
        table = steep_table(probe, tmp_path / "t.json")
    return cuda_engine(target, drafter, spec=spec, verify=verify, cost_table=table, cuda_graphs=True, **kw)


@pytest.mark.parametrize("spec,verify", GRAPH_MODES[2:])
def test_cuda_graph_confidence_scheduled_steps_are_lossless_and_trim(tmp_path, spec, verify):
    target = tiny_target(45)
    drafter = tiny_drafter(target, 46, block_size=4)
    prompts = prompts_for(45, 11, lo=2, hi=60)
    params = [SamplingParams(max_tokens=16 + 7 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    base = [o.token_ids for o in cuda_engine(target, None, spec="off", max_num_seqs=8).generate(prompts, params)]
    for overlap in (False, True):
        eng = graph_engine(tmp_path, target, drafter, spec, verify, max_num_seqs=8, overlap=overlap,
                           budget_lag=2 if overlap else 1)
        out = [o.token_ids for o in eng.generate(prompts, params)]
        assert out == base, overlap
        c = eng.counters()
        assert c["graph_replays"] > 0 and c["trimmed_steps"] > 0 and c["window_tokens"] < c["ceiling_tokens"]


def test_captured_draft_graphs_below_plan_min_rows_skip_the_head_and_stay_lossless(tmp_path):
    """engine.plan_min_rows=4 on CUDA graphs (overlap): draft graphs of 1-2 rows are captured without the
    confidence head and their steps plan nothing; graphs of 4 and 8 rows run it, plan and trim; outputs stay the
    target's."""
    target = tiny_target(45)
    drafter = tiny_drafter(target, 46, block_size=4)
    prompts = prompts_for(45, 11, lo=2, hi=60)
    params = [SamplingParams(max_tokens=16 + 7 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    base = [o.token_ids for o in cuda_engine(target, None, spec="off", max_num_seqs=8).generate(prompts, params)]
    eng = graph_engine(tmp_path, target, drafter, "dspark", "ragged", max_num_seqs=8, overlap=True, budget_lag=2,
                       plan_min_rows=4)
    assert [o.token_ids for o in eng.generate(prompts, params)] == base
    c = eng.counters()
    assert c["graph_replays"] > 0 and c["trimmed_steps"] > 0
    assert c["trimmed_steps"] <= c["confidence_head_steps"] < c["decode_steps"]
    assert c["sched/plan_reason.declined_small_batch"] > 0
    assert not eng.steps.runs_confidence_head(2) and eng.steps.runs_confidence_head(4)


@pytest.mark.parametrize("score,sampled", [("max_prob", False), ("top_gap", False), ("top_gap", True)])
def test_scored_survival_from_one_pass_and_one_kernel_in_graphs(tmp_path, score, sampled):
    """A drafter calibrated with sts_max_prob (or sts_top_gap) on CUDA graphs: the greedy draft's top
    probabilities (top-2 gaps) come from the argmax kernel's own pass (greedy_argmax with top_out, gap_out), the
    head, the calibration with its score term and the survival from kernels/confidence_survival.py; the survival
    the planner reads is the drafter's calibration of the raw logits and scores the step wrote, outputs stay the
    target's, and the engine trims. ``sampled``: the steps read afterwards draw their drafts at T=0.8, the gaps
    from the fused draw's own pass (kernels/draft_sampling.py gap_out)."""
    from dspark.sampling import fused_draft_sampling_enabled
    from dspark.survival import prefix_survival

    target = tiny_target(45)
    drafter = tiny_drafter(target, 46, block_size=4)
    weights = {f"{score}_weights": [0.6, 0.4, -0.2, 0.8]}
    drafter.set_confidence_temperatures([0.8, 1.0, 1.2, 0.9], biases=[0.1, 0.0, -0.2, 0.3], **weights)
    prompts = prompts_for(45, 11, lo=2, hi=60)
    params = [SamplingParams(max_tokens=16 + 7 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    base = [o.token_ids for o in cuda_engine(target, None, spec="off", max_num_seqs=8).generate(prompts, params)]
    eng = graph_engine(tmp_path, target, drafter, "dspark", "ragged", max_num_seqs=8, overlap=True, budget_lag=2)
    assert eng.steps._fused_confidence()
    assert eng.steps.keeps_max_prob() == (score == "max_prob") and eng.steps.keeps_top_gap() == (score == "top_gap")
    assert [o.token_ids for o in eng.generate(prompts, params)] == base
    c = eng.counters()
    assert c["graph_replays"] > 0 and c["trimmed_steps"] > 0 and c[f"confidence_calibration/sts_{score}_steps"] > 0
    eng.reset()
    for i, p in enumerate(prompts[:6]):
        eng.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True,
                                          **({"temperature": 0.8, "seed": i} if sampled else {})))
    assert fused_draft_sampling_enabled(eng.steps.kernels, eng.steps.device) or not sampled
    for _ in range(12):
        eng.step()
    torch.cuda.synchronize()
    st = eng.steps
    act = st.active[:6]
    if score == "max_prob":
        top = st.max_prob[:6]
        assert act.all() and ((top > 0) & (top <= 1)).all() and top.unique().numel() > 6
        want = prefix_survival(drafter.calibrated_confidence(st.confidence_logits[:6], top))
    else:
        gap = st.top_gap[:6]
        assert act.all() and (gap >= 0).all() and gap.unique().numel() > 6
        want = prefix_survival(drafter.calibrated_confidence(st.confidence_logits[:6], top_gap=gap))
    torch.testing.assert_close(st.survival[:6], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_greedy_calibration_is_read_by_the_greedy_graphs_alone(tmp_path, sampled):
    """engine.greedy_confidence_calibration (sts_top_gap) on CUDA graphs, the drafter's own calibration sts_bias:
    the captured draft stage of all-greedy rows reads the top-gap calibration with the gaps of the argmax kernel's
    pass, the one of sampled rows (T=0.8) the drafter's own through the fused kernel; outputs stay the target's."""
    from dspark.survival import prefix_survival
    from dspark.training.calibration import save_temperatures

    target = tiny_target(45)
    drafter = tiny_drafter(target, 46, block_size=4)
    drafter.set_confidence_temperatures([0.8, 1.0, 1.2, 0.9], biases=[0.1, 0.0, -0.2, 0.3])
    save_temperatures(tmp_path / "gap", [1.1, 0.9, 1.0, 0.7], biases=[0.2, -0.1, 0.0, 0.1],
                      top_gap_weights=[0.6, 0.4, -0.2, 0.8])
    prompts = prompts_for(45, 11, lo=2, hi=60)
    params = [SamplingParams(max_tokens=16 + 7 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    base = [o.token_ids for o in cuda_engine(target, None, spec="off", max_num_seqs=8).generate(prompts, params)]
    eng = graph_engine(tmp_path, target, drafter, "dspark", "ragged", max_num_seqs=8, overlap=True, budget_lag=2,
                       greedy_confidence_calibration=str(tmp_path / "gap"))
    assert eng.steps._fused_confidence() and eng.steps.keeps_top_gap()
    assert [o.token_ids for o in eng.generate(prompts, params)] == base
    c = eng.counters()
    assert c["graph_replays"] > 0 and c["confidence_calibration/greedy_sts_top_gap_steps"] > 0
    eng.reset()
    for i, p in enumerate(prompts[:6]):
        eng.add_request(p, SamplingParams(max_tokens=200, ignore_eos=True,
                                          **({"temperature": 0.8, "seed": i} if sampled else {})))
    for _ in range(12):
        eng.step()
    torch.cuda.synchronize()
    st = eng.steps
    assert st.active[:6].all() and eng.steps.keeps_top_gap() == (not sampled)
    c = eng.counters()
    assert (c["confidence_calibration/greedy_sts_top_gap_steps"] == 0) == sampled
    assert (c["confidence_calibration/sts_bias_steps"] == 0) == (not sampled)
    if sampled:
        want = prefix_survival(drafter.calibrated_confidence(st.confidence_logits[:6]))
    else:
        gap = st.top_gap[:6]
        assert (gap >= 0).all() and gap.unique().numel() > 6
        want = prefix_survival(st.greedy_drafter.calibrated_confidence(st.confidence_logits[:6], top_gap=gap))
    torch.testing.assert_close(st.survival[:6], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec,verify", GRAPH_MODES)
def test_steady_graph_steps_never_sync_the_host(tmp_path, spec, verify):
    target = tiny_target(43)
    drafter = tiny_drafter(target, 44, block_size=4) if spec == "dspark" else None
    eng = graph_engine(tmp_path, target, drafter, spec, verify, dtype="bfloat16", max_num_seqs=16, overlap=True,
                       budget_lag=2, max_model_len=480, max_num_batched_tokens=1024)
    sp = SamplingParams(max_tokens=400, ignore_eos=True)
    for p in prompts_for(43, 16, lo=2, hi=40):
        eng.add_request(p, sp)
    run_steady_steps_without_sync(eng, warm=12, steps=30)


def test_steady_steps_with_the_online_max_prob_estimate_never_sync_the_host(tmp_path):
    """engine.acceptance_estimate=draft_max_prob sends the device a new estimate table after every committed
    step; from pageable memory that copy waited for the step in flight (the host's commit then took the
    device's whole step: -35% in service at concurrency 256)."""
    target = tiny_target(43)
    drafter = tiny_drafter(target, 44, block_size=4)
    eng = graph_engine(tmp_path, target, drafter, "dspark", "ragged", dtype="bfloat16", max_num_seqs=16, overlap=True,
                       budget_lag=2, max_model_len=480, max_num_batched_tokens=1024,
                       acceptance_estimate="draft_max_prob")
    sp = SamplingParams(max_tokens=400, ignore_eos=True)
    for p in prompts_for(43, 16, lo=2, hi=40):
        eng.add_request(p, sp)
    run_steady_steps_without_sync(eng, warm=12, steps=30)
    assert eng.acceptance_estimate.tested.sum() > 0  # the table learnt from the steps


@pytest.mark.parametrize("spec,verify", [("off", "full"), ("dspark", "full"), ("dspark", "ragged")])
def test_cuda_graph_sampled_rows_match_eager_and_never_sync(tmp_path, spec, verify):
    target = tiny_target(47)
    drafter = tiny_drafter(target, 48, block_size=4) if spec == "dspark" else None
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=(0 if i % 2 else 20), max_tokens=300, seed=i,
                             ignore_eos=True) for i in range(12)]
    prompts = prompts_for(47, len(params), lo=2, hi=40)
    kw = dict(spec=spec, max_num_seqs=16, max_model_len=480, max_num_batched_tokens=1024)
    lag = {}
    if verify != "full":
        lag = dict(budget_lag=2)
        probe = cuda_engine(target, drafter, dtype="float32")
        kw["cost_table"] = steep_table(probe, tmp_path / "eager.json")
    short = [dataclasses.replace(p, max_tokens=24) for p in params]
    buckets = dict(token_buckets=(64, 128, 256, 512, 1024)) if verify == "ragged" else {}  # eager ragged on a GPU
    base = [o.token_ids for o in cuda_engine(target, drafter, verify=verify, **lag, **buckets, **kw).generate(prompts, short)]
    eng = graph_engine(tmp_path, target, drafter, spec, verify, overlap=True, budget_lag=2,
                       **{k: v for k, v in kw.items() if k not in ("spec", "cost_table")})
    out = [o.token_ids for o in eng.generate(prompts, short)]
    # The Triton acceptance kernel and the torch reference agree up to summation order at a CDF step.
    assert sum(a == b for a, b in zip(out, base)) >= len(prompts) - 1
    eng.reset()
    for p, sp in zip(prompts, params):
        eng.add_request(p, sp)
    run_steady_steps_without_sync(eng, warm=12, steps=20)


def test_graph_timing_reports_device_ms_per_graph_and_per_step(tmp_path):
    """GraphDecoder.start_timing (bench_decode graph_timing=true): CUDA events around every replay
    give a positive device time per captured graph, and per step mode (a trimmed ragged step spans
    its draft and verify graphs); outputs are unchanged by the timing."""
    target = tiny_target(45)
    drafter = tiny_drafter(target, 46, block_size=4)
    prompts = prompts_for(45, 6, lo=2, hi=40)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in graph_engine(tmp_path, target, drafter, "dspark", "ragged",
                                               max_num_seqs=8).generate(prompts, params)]
    eng = graph_engine(tmp_path, target, drafter, "dspark", "ragged", max_num_seqs=8)
    eng.graph.start_timing()
    assert [o.token_ids for o in eng.generate(prompts, params)] == plain
    t = eng.graph.timing_summary()
    assert t["graph_device_ms_median"] and all(v > 0 for v in t["graph_device_ms_median"].values())
    assert "ragged" in t["step_device_ms_median"] and t["steps_timed"]["ragged"] > 0
    assert any(k.startswith("draft") for k in t["graph_device_ms_median"])
    assert t["step_gap_ms_median"] >= 0.0 and t["step_gap_ms_p90"] >= t["step_gap_ms_median"]
    assert 0.0 <= t["device_idle_fraction"] < 1.0
    c = eng.counters()  # the engine's counters carry each step mode's device time (runners.ab's blocks)
    assert c["device/ragged_step_ms_median"] == t["step_device_ms_median"]["ragged"] > 0


@pytest.mark.parametrize("spec,verify", [("off", "full"), ("dspark", "full"), ("dspark", "ragged")])
def test_l2_prefetch_keeps_tokens_and_runs_in_the_captured_steps(tmp_path, monkeypatch, spec, verify):
    """engine.kernels.l2_prefetch=true (kernels/l2_prefetch.py): the side-stream prefetch of the next layer's
    weights is captured into the decode graphs (its kernel is launched while they capture) and the
    greedy tokens are those of the same engine without it, with overlap."""
    from kernels import l2_prefetch as pf

    target = tiny_target(61)
    drafter = tiny_drafter(target, 62, block_size=4) if spec == "dspark" else None
    prompts = prompts_for(61, 3, lo=2, hi=30)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    kw = dict(overlap=True, budget_lag=2, max_num_seqs=3, dtype="bfloat16")
    if verify == "ragged":
        kw["token_buckets"] = (32, 64, 128)
    plain_eng = graph_engine(tmp_path, target, drafter, spec, verify, **kw)
    assert "l2_prefetch" not in plain_eng.fingerprint()["kernels"]
    plain = [o.token_ids for o in plain_eng.generate(prompts, sp)]
    launches = []
    real = pf.l2_prefetch
    monkeypatch.setattr(pf, "l2_prefetch", lambda ts, out=None, programs=pf.PROGRAMS_PER_TENSOR:
                        launches.append((len(ts), programs)) or real(ts, out, programs))
    eng = graph_engine(tmp_path, target, drafter, spec, verify,
                       kernels={"l2_prefetch": True, "l2_prefetch_programs": 8}, **kw)
    assert "l2_prefetch" in eng.fingerprint()["kernels"]
    got = [o.token_ids for o in eng.generate(prompts, sp)]
    assert got == plain
    assert launches and set(launches) == {(4, 8)}  # qkv, o_proj, gate/up, down of the next layer
    assert eng.counters()["graph_replays"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_megakernel_runs_every_batch1_target_step_and_keeps_tokens(dtype):
    """One request decoding target-only (graphs, overlap): every steady step replays a graph whose
    target forward is the decode megakernel (kernels/decode_megakernel.py), the tokens are those of
    the layer kernels (engine.kernels.decode_megakernel=false, the default), and steady steps never
    sync the host."""
    target = tiny_target(71)
    prompts = prompts_for(71, 3, lo=2, hi=60)
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    kw = dict(spec="off", dtype=dtype, max_num_seqs=1, cuda_graphs=True, overlap=True)
    runs = {}
    for switch in ("0", "1"):
        eng = cuda_engine(target, None, kernels={"decode_megakernel": switch == "1"}, **kw)
        runs[switch] = ([o.token_ids for o in eng.generate(prompts, sp)], eng.counters())
    assert runs["1"][0] == runs["0"][0]
    assert runs["0"][1]["megakernel_steps"] == 0
    c = runs["1"][1]
    assert c["graph_replays"] > 0 and c["megakernel_steps"] >= c["graph_replays"]
    eng = cuda_engine(target, None, kernels={"decode_megakernel": True}, **{**kw, "max_model_len": 480})
    eng.add_request(prompts[0], SamplingParams(max_tokens=400, ignore_eos=True))
    run_steady_steps_without_sync(eng, warm=6, steps=30)
    assert eng.counters()["megakernel_steps"] >= 30
