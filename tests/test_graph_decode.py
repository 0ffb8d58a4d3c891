"""Device-resident decode steps (engine.cuda_graphs) and the overlap scheduler, on the CPU.

On the CPU the captured step function runs eagerly over the same persistent buffers, so
these tests check its logic (device-side metadata, acceptance, state update, page-table
updates, the pipeline's drain on membership changes) against the host-built eager path.
The CUDA-graph capture itself and sync-freedom are checked in tests/test_engine_gpu.py.
"""

import time

import pytest
import torch

from dspark.config import ConfigError, EngineConfig, SamplingParams
from dspark.engine import Engine
from dspark.stats import HOST_PHASES
from test_engine_lossless import prompts_for as lossless_prompts
from tiny import tiny_drafter, tiny_engine_config, tiny_target, trained_tiny_pair


def prompts_for(seed, n, lo=2, hi=30):
    return lossless_prompts(seed, n, lo=lo, hi=hi)


def generate(target, drafter, prompts, params, **cfg):
    eng = Engine(target, None, tiny_engine_config(spec="dspark" if drafter is not None else "off", **cfg), drafter)
    outs = eng.generate(prompts, params)
    return [o.token_ids for o in outs], eng


@pytest.mark.parametrize("spec", ["off", "dspark"])
@pytest.mark.parametrize("overlap", [False, True])
def test_device_resident_steps_emit_what_the_eager_engine_emits(spec, overlap):
    target, drafter = trained_tiny_pair(3, block_size=4)  # varied text, drafts rejected and accepted
    drafter = drafter if spec == "dspark" else None
    prompts = prompts_for(5, 7)
    # Different lengths: requests finish at different steps, so rows leave the device batch while
    # the waiting ones are admitted (max_num_seqs 4 < 7 requests), prefilled and join it: all of it
    # on the device-resident path, none of it through an eager step.
    params = [SamplingParams(max_tokens=12 + 5 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    base, _ = generate(target, drafter, prompts, params, max_num_seqs=4)
    fast, eng = generate(target, drafter, prompts, params, max_num_seqs=4, cuda_graphs=True, overlap=overlap)
    assert fast == base
    assert len({t for ids in base for t in ids}) > 10
    c = eng.counters()
    if spec == "dspark":
        assert 0 < c["accepted_tokens"] < c["drafted_tokens"], c  # some drafts accepted, some rejected
    assert c["graph_eager_steps"] > 0 and c["graph_replays"] == 0  # CPU: the step ran, uncaptured
    assert c["eager_reason/cpu"] == c["graph_eager_steps"]
    assert c["eager_steps"] == 0 and not any(k.startswith("eager_reason/") and k != "eager_reason/cpu" for k in c)
    assert c["device_resident_share"] == 1.0
    assert c["prefill_uncaptured"] > 0 and c["prefill_tokens"] > 0  # prefills on the device path (uncaptured on CPU)
    assert c["mixed_steps"] > 0  # admissions while others decode
    assert 1.0 < c["mean_running_batch"] <= 4.0
    if overlap:
        assert c["pipelined_steps"] > 0
        assert c["discarded_row_steps"] > 0  # rows that finished one step before the in-flight one
    else:
        assert c["pipelined_steps"] == 0 and c["discarded_row_steps"] == 0
    assert c["emitted_tokens"] >= sum(len(t) for t in base)
    assert c["host_ms_per_graph_step_median"] > 0  # host scheduling time of device-resident steps
    phases = {k: c[f"host/{k}_ms_per_step"] for k in HOST_PHASES}
    assert all(v >= 0.0 for v in phases.values()), phases
    # On a CPU the forward runs inside launch and prefill; planning and commits are host work of every step.
    assert phases["launch"] > 0 and phases["commit"] > 0 and phases["prefill"] > 0 and phases["caller"] > 0


def test_host_phases_are_parts_of_the_step_calls_and_of_the_time_between_them():
    target = tiny_target(3)
    eng = Engine(target, None, tiny_engine_config(spec="dspark", max_num_seqs=4, cuda_graphs=True, overlap=True),
                 tiny_drafter(target, 7, block_size=4))
    for p in prompts_for(5, 7):
        eng.add_request(p, SamplingParams(max_tokens=20, ignore_eos=True))
    inside = between = 0.0
    last_end = None
    while eng.has_unfinished():
        start = time.perf_counter()
        if last_end is not None:
            time.sleep(0.002)  # the caller's own work between two calls
            start = time.perf_counter()
            between += start - last_end
        eng.step()
        last_end = time.perf_counter()
        inside += last_end - start
    c = eng.counters()
    calls = c["host/step_calls"]
    assert calls > 10
    total = {k: c[f"host/{k}_ms_per_step"] * calls * 1e-3 for k in HOST_PHASES}
    assert all(v >= 0.0 for v in total.values()), total
    # Each phase is a part of a step() call (caller: of the time between calls), so their totals fit inside.
    assert sum(v for k, v in total.items() if k != "caller") <= inside
    # (the engine's own interval also holds entering and leaving step()'s inference mode: under 1 ms a call)
    assert 0.002 * (calls - 1) <= total["caller"] <= between + 0.001 * calls


def test_eos_and_page_growth_inside_the_pipeline():
    target, drafter = trained_tiny_pair(4, block_size=3)
    prompts = prompts_for(9, 3, lo=14, hi=17)
    params = SamplingParams(max_tokens=40)  # EOS allowed: some requests stop early
    base, _ = generate(target, drafter, prompts, params, kv_block_size=4)
    fast, eng = generate(target, drafter, prompts, params, kv_block_size=4, cuda_graphs=True, overlap=True)
    assert fast == base
    assert eng.counters()["graph_eager_steps"] >= 5  # the pages grew many times (4-token pages)


@pytest.mark.parametrize("spec,verify", [("off", "full"), ("dspark", "full"), ("dspark", "ragged")])
def test_sampled_rows_on_device_steps_draw_what_the_eager_engine_draws(tmp_path, spec, verify):
    """Counter-based uniforms + the same processing and acceptance rule: token-identical samples."""
    target = tiny_target(5)
    drafter = tiny_drafter(target, 9, block_size=3) if spec == "dspark" else None
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=(0 if i % 2 else 20), max_tokens=12, seed=3 + i,
                             ignore_eos=True) for i in range(5)]
    params.append(SamplingParams(max_tokens=12, ignore_eos=True))  # one greedy row in the sampled batch
    prompts = prompts_for(1, len(params))
    kw = {}
    if verify != "full":
        from test_engine_scheduling import steep_table

        probe = Engine(target, None, tiny_engine_config(cuda_graphs=True, overlap=True, budget_lag=2), drafter)
        kw = dict(verify=verify, cost_table=steep_table(probe, tmp_path / "t.json"), budget_lag=2)
        base, _ = generate(target, drafter, prompts, params, **{**kw, "cost_table": steep_table(
            Engine(target, None, tiny_engine_config(), drafter), tmp_path / "e.json"), "budget_lag": 2})
    else:
        base, _ = generate(target, drafter, prompts, params)
    fast, eng = generate(target, drafter, prompts, params, cuda_graphs=True, overlap=True, **kw)
    assert fast == base
    c = eng.counters()
    assert c["graph_eager_steps"] > 0 and "eager_reason/sampled_rows" not in c


def test_graph_configs_refused_with_a_fix():
    with pytest.raises(ConfigError, match="cuda_graphs=true"):
        EngineConfig(overlap=True)
    target = tiny_target(0)
    drafter = tiny_drafter(target, 1, block_size=4)
    with pytest.raises(ConfigError, match="multiples of 5"):
        Engine(target, None, tiny_engine_config(spec="dspark", cuda_graphs=True, token_buckets=(5, 12)), drafter)


@pytest.mark.parametrize("verify,min_len", [("uniform", 1), ("ragged", 1), ("ragged", 0)])
@pytest.mark.parametrize("overlap", [False, True])
def test_confidence_scheduled_device_steps_trim_and_stay_lossless(tmp_path, verify, min_len, overlap):
    from test_engine_scheduling import device_step_models_and_table

    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap)
    prompts = prompts_for(12, 7)
    params = [SamplingParams(max_tokens=14 + 4 * (i % 3), ignore_eos=True) for i in range(len(prompts))]
    base, _ = generate(target, None, prompts, params, max_num_seqs=4)
    fast, eng = generate(target, drafter, prompts, params, max_num_seqs=4, verify=verify, cost_table=table,
                         budget_lag=lag, cuda_graphs=True, overlap=overlap, min_verify_len=min_len)
    assert fast == base
    c = eng.counters()
    if min_len == 0:  # some request verified its anchor alone (window 0) on a device-resident step
        assert c.get("sched/verify_len_hist.0", 0) > 0, c
    assert c["graph_eager_steps"] > 0
    assert c["trimmed_steps"] > 0 and c["window_tokens"] < c["ceiling_tokens"]  # the feature ran
    # The trims happened on the device-resident steps, not only on eager ones.
    assert c["eager_steps"] < c["steps"] and c.get("sched/trimmed_steps", 1) > 0


def test_verify_all_steps_skip_the_confidence_head_that_planning_steps_run(tmp_path):
    """A verify-all engine reads no survival: its draft stage never calls the confidence head, copies no survival
    to the host, and emits the same tokens as with the head on; a planning engine's steps run the head."""
    from test_engine_scheduling import device_step_models_and_table

    target, drafter, lag, table = device_step_models_and_table(tmp_path, overlap=True)
    calls = []
    hook = drafter.confidence_head.register_forward_hook(lambda *_: calls.append(1))
    prompts = prompts_for(14, 5)
    params = [SamplingParams(max_tokens=12, ignore_eos=True)] * len(prompts)
    try:
        plain, eng = generate(target, drafter, prompts, params, max_num_seqs=4, cuda_graphs=True, overlap=True,
                              budget_lag=lag)
        assert not eng.steps.runs_confidence_head() and calls == [] and not eng.steps.survival.any()
        assert eng.graph.launch(1).survival is None and eng.counters()["graph_eager_steps"] > 0
        eng = Engine(target, None, tiny_engine_config(max_num_seqs=4, cuda_graphs=True, overlap=True,
                                                      budget_lag=lag), drafter)
        eng.steps.confidence = True  # the head on, as a planning engine runs it: the same tokens
        assert [o.token_ids for o in eng.generate(prompts, params)] == plain and calls and eng.steps.survival.any()
        planning = Engine(target, None, tiny_engine_config(max_num_seqs=4, verify="ragged", cost_table=table,
                                                           cuda_graphs=True, overlap=True, budget_lag=lag), drafter)
        assert planning.steps.runs_confidence_head()
    finally:
        hook.remove()


def test_confidence_scheduled_graph_configs_refused():
    with pytest.raises(ConfigError, match="budget_lag=2"):
        EngineConfig(cuda_graphs=True, overlap=True, verify="ragged", budget_lag=1)
    with pytest.raises(ConfigError, match="budget_lag=1"):
        EngineConfig(cuda_graphs=True, verify="uniform", budget_lag=0)
    with pytest.raises(ConfigError, match="greedy_stop"):
        EngineConfig(cuda_graphs=True, verify="ragged", planner_algorithm="greedy_stop")
    with pytest.raises(ConfigError, match="cuda_graphs=false"):
        EngineConfig(cuda_graphs=True, verify="cap_accept")


def test_profiler_measures_device_resident_steps():
    """The cost table of a graph engine is measured on graph steps (forced lengths honoured)."""
    from dspark.profiler import collect_measurements

    target = tiny_target(7)
    drafter = tiny_drafter(target, 12, block_size=3)
    eng = Engine(target, None, tiny_engine_config(cuda_graphs=True, overlap=True, budget_lag=2, max_num_seqs=4),
                 drafter)
    samples = collect_measurements(eng, batch_sizes=[1, 4], verify_lens=[0, 1, 3], warmup_steps=1, measure_steps=2,
                                   prompt_len=8, seed=0)
    assert sorted({(b, m) for b, m, _ in samples}) == [(1, 1), (1, 2), (1, 4), (4, 4), (4, 8), (4, 16)]
    assert eng.fingerprint()["step_path"] == "graphs+overlap" and eng.fingerprint()["step_timing"] == "step-call"


def test_a_graph_path_table_timed_the_old_way_is_refused():
    """A graph-path cost table without step_timing priced steps from launch + commit only (too low);
    it is refused, and an eager table (nothing to check) still loads."""
    from dspark.cost_table import CostTableMismatchError, fit_cost_table

    target = tiny_target(7)
    drafter = tiny_drafter(target, 12, block_size=3)
    eng = Engine(target, None, tiny_engine_config(cuda_graphs=True, overlap=True, budget_lag=2, max_num_seqs=4),
                 drafter)
    old = {k: v for k, v in eng.fingerprint().items() if k != "step_timing"}
    table = fit_cost_table([(1, 1, 1.0), (1, 2, 1.5), (1, 4, 2.0)], fingerprint=old)
    with pytest.raises(CostTableMismatchError, match="step_timing"):
        table.check_fingerprint(eng.fingerprint())
    eager = Engine(target, None, tiny_engine_config(max_num_seqs=4), drafter).fingerprint()
    assert "step_timing" not in eager
    fit_cost_table([(1, 1, 1.0), (1, 2, 1.5)], fingerprint=eager).check_fingerprint(eager)  # no raise


@pytest.mark.parametrize("mode", ["uniform", "ragged"])
def test_verify_stage_never_packs_past_its_bucket(tmp_path, mode):
    """A verify stage run with a tier/extra larger than its bucket holds (as a capture's warm-up
    may see) cuts the packed rows at T instead of indexing past the bucket's buffers."""
    from test_engine_scheduling import steep_table

    target = tiny_target(6)
    drafter = tiny_drafter(target, 11, block_size=4)
    probe = Engine(target, None, tiny_engine_config(cuda_graphs=True, budget_lag=1), drafter)
    eng = Engine(target, None, tiny_engine_config(verify=mode, cost_table=steep_table(probe, tmp_path / "t.json"),
                                                  budget_lag=1, cuda_graphs=True, max_num_seqs=4), drafter)
    for p in prompts_for(3, 4):
        eng.add_request(p, SamplingParams(max_tokens=30, ignore_eos=True))
    while eng.counters()["graph_eager_steps"] < 4:  # running, device-resident steps under way
        eng.step()
    gd = eng.graph
    T = gd.token_buckets[0]
    gd.tier.fill_(gd.G)
    gd.extra.fill_(10 ** 6)
    with torch.inference_mode():
        gd._verify_stage(T, min(T, gd.S), mode)
    windows = gd.out[: min(T, gd.S), 1]
    # The first row's anchor and window fit (T >= block + 1); the rows past the bucket got nothing.
    assert int(windows[0]) == gd.G and int(windows[1:].sum()) == 0 and T < 2 * (gd.G + 1)


def test_forced_trimmed_path_runs_the_full_block_as_a_split_step(monkeypatch):
    """engine.force_trimmed_path (the profiler's trim-overhead probe): a forced full-block verify
    goes through the draft + verify graphs a trimmed step uses, not the fused full step, and
    emits the same tokens; without force_verify_len the setting is refused."""
    from dspark.graph_decode import GraphDecoder

    target = tiny_target(3)
    drafter = tiny_drafter(target, 4, block_size=3)
    modes = []
    real = GraphDecoder.launch
    monkeypatch.setattr(GraphDecoder, "launch", lambda self, n, mode="full", **kw: modes.append(mode)
                        or real(self, n, mode, **kw))
    prompts = prompts_for(2, 3)
    params = [SamplingParams(max_tokens=10, ignore_eos=True)] * 3
    base, _ = generate(target, drafter, prompts, params, cuda_graphs=True)
    assert set(modes) == {"full"}
    modes.clear()
    split, eng = generate(target, drafter, prompts, params, cuda_graphs=True, verify="uniform", force_verify_len=3,
                          force_trimmed_path=True, budget_lag=1)
    assert split == base and modes and set(modes) == {"uniform"}
    with pytest.raises(ConfigError, match="force_verify_len"):
        EngineConfig(verify="uniform", force_trimmed_path=True)


def test_timing_summary_is_empty_without_graphs_and_timing():
    """Device timing is a CUDA-event diagnostic: off by default, and nothing to report on the CPU's
    eager path (bench_decode only asks for it on CUDA)."""
    target = tiny_target(3)
    drafter = tiny_drafter(target, 4, block_size=3)
    _, eng = generate(target, drafter, prompts_for(2, 2), [SamplingParams(max_tokens=6, ignore_eos=True)] * 2,
                      cuda_graphs=True)
    assert eng.graph.timing is None and eng.graph.timing_summary() == {}


def test_timing_summary_reports_device_gaps_between_steps(monkeypatch):
    """The step gaps come from consecutive steps' events: the end of a step's last graph to the start
    of the next step's first; the idle share is the part of the timed span in which no graph ran. Prefills
    on their own stream overlap the steps: they are left out of the gaps and counted once in the busy time."""
    from dspark.graph_decode import GraphDecoder

    class Ev:  # a recorded CUDA event at time t (ms)
        def __init__(self, t):
            self.t = t

        def elapsed_time(self, other):
            return other.t - self.t

    gd = GraphDecoder.__new__(GraphDecoder)
    gd.device = torch.device("cpu")
    gd.prefill_stream = None
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    # step 0: draft 0-1, verify 1.5-3; step 1 starts at 3.5 (gap 0.5); step 2 at 7 (gap 2.0 after 5)
    G = (True, False, False)  # a greedy batch's sampling signature, the last part of a decode graph's key
    gd.timing = [("ragged", [(("draft", 8, G), Ev(0.0), Ev(1.0)), (("verify", 16, "ragged", G), Ev(1.5), Ev(3.0))], 8),
                 ("full", [(("step", 32, G), Ev(3.5), Ev(5.0))], 8),
                 ("full", [(("step", 32, G), Ev(7.0), Ev(8.0))], 4)]
    t = gd.timing_summary()
    assert t["step_device_ms_median"] == {"ragged": 3.0, "full": 1.25}
    # per mode and batch bucket: the ragged and the full step of 8 rows compare directly
    assert t["step_device_ms_median_by_batch"] == {"full/b4": 1.0, "full/b8": 1.5, "ragged/b8": 3.0}
    assert t["steps_timed_by_batch"] == {"full/b4": 1, "full/b8": 1, "ragged/b8": 1}
    # per graph: the ragged step's draft and verify graphs apart, the fused step's graph
    assert t["graph_device_ms_median"] == {"draft_8": 1.0, "verify_ragged_16": 1.5, "step_32": 1.25}
    assert t["graph_replays_timed"] == {"draft_8": 1, "verify_ragged_16": 1, "step_32": 2}
    from dspark.graph_decode import _graph_name  # a sampled batch's graphs are named apart from greedy ones

    assert _graph_name(("verify", 16, "ragged", (False, True, False))) == "verify_ragged_16_sampled_topk"
    assert _graph_name(("prefill", 64, 2)) == "prefill_64x2"
    assert t["step_gap_ms_median"] == 1.25 and t["step_gap_ms_p90"] == pytest.approx(0.5 + 0.9 * 1.5)
    assert t["device_idle_fraction"] == round(3.0 / 8.0, 4)  # 1-1.5, 3-3.5 and 5-7 ran nothing
    t = gd.timing_summary(skip_steps=1)
    assert t["step_gap_ms_median"] == 2.0 and t["device_idle_fraction"] == round(2.0 / 4.5, 4)
    # A prefill on its own stream from 4.5 to 7.5 overlaps both steps after it: no gap, and 7-7.5 is busy once.
    gd.prefill_stream = object()
    gd.timing = [("full", [(("step", 32, G), Ev(3.5), Ev(5.0))], 8),
                 ("prefill", [(("prefill", 64, 1), Ev(4.5), Ev(7.5))], 0),
                 ("full", [(("step", 32, G), Ev(7.0), Ev(8.0))], 8)]
    t = gd.timing_summary()
    assert t["step_gap_ms_median"] == 2.0 and t["device_idle_fraction"] == 0.0


@pytest.mark.parametrize("overlap", [False, True])
def test_a_committed_steps_time_is_the_period_between_commits(monkeypatch, overlap):
    """StepInfo.step_ms of a device-resident step is what the service pays for it: from the previous step's
    commit to this one's. Host work before the launch (a slow planning stand-in, 20 ms) and the caller's
    own work between step() calls (10 ms) are both in it, and nothing from before the previous commit."""
    import time as _time

    target = tiny_target(11)
    drafter = tiny_drafter(target, 12, block_size=3)
    eng = Engine(target, None, tiny_engine_config(spec="dspark", cuda_graphs=True, overlap=overlap), drafter)
    for p in prompts_for(13, 3, lo=4, hi=8):
        eng.add_request(p, SamplingParams(max_tokens=30, ignore_eos=True))
    real = Engine._graph_decision

    def slow_decision(self, running):
        _time.sleep(0.02)
        return real(self, running)

    monkeypatch.setattr(Engine, "_graph_decision", slow_decision)
    timed, previous_start = [], None
    while eng.has_unfinished() and len(timed) < 4:
        _time.sleep(0.01)  # the caller's work between steps
        t0 = _time.perf_counter()
        eng.step()
        end = _time.perf_counter()
        info = eng.last_step
        if info is not None and info.num_decodes == 3 and eng.counters()["graph_eager_steps"] >= 3:
            # (the step() call before committed a step too: the first commit has no previous one)
            timed.append((info.step_ms, (end - previous_start) * 1e3))
        previous_start = t0
    assert timed
    for step_ms, since_previous_call in timed:
        assert 30.0 <= step_ms <= since_previous_call + 0.01


@pytest.mark.parametrize("overlap", [False, True])
def test_chunked_prefills_and_many_admissions_stay_on_the_device_path(overlap):
    """Prompts longer than the step's prefill budget are prefilled in chunks over several calls while
    other rows decode, and more requests are admitted at once than one prefill forward packs
    (max_prefill_segments); rows join and retire in any order. Tokens equal the eager engine's."""
    target = tiny_target(11)
    drafter = tiny_drafter(target, 12, block_size=3)
    prompts = prompts_for(13, 22, lo=3, hi=150)
    params = [SamplingParams(max_tokens=6 + 4 * (i % 5), ignore_eos=True) for i in range(len(prompts))]
    kw = dict(max_num_seqs=20, max_num_batched_tokens=64)
    base, _ = generate(target, drafter, prompts, params, **kw)
    fast, eng = generate(target, drafter, prompts, params, cuda_graphs=True, overlap=overlap, budget_lag=2, **kw)
    assert fast == base
    c = eng.counters()
    assert c["eager_steps"] == 0 and c["device_resident_share"] == 1.0
    assert c["prefill_tokens"] == sum(len(p) - 1 for p in prompts)  # every prompt position once, chunked
    assert c["prefill_uncaptured"] > len(prompts) / eng.graph.max_prefill_segments


def test_rows_retire_by_moving_the_last_live_rows_into_the_holes():
    target = tiny_target(3)
    eng = Engine(target, None, tiny_engine_config(spec="off", cuda_graphs=True, max_num_seqs=8), None)
    reqs = []
    for i, p in enumerate(prompts_for(2, 6)):
        rid = eng.add_request(p, SamplingParams(max_tokens=4))
        reqs.append(eng._requests[rid])
    gd = eng.graph
    for r in reqs:
        eng.blocks.reserve(r.req_id, r.num_tokens + 4)
    gd.join(reqs)
    state = [(int(gd.seq_len[i]), int(gd.anchor[i])) for i in range(6)]
    gd.retire({reqs[1].req_id, reqs[4].req_id, reqs[5].req_id})
    assert [r.req_id for r in gd.rows] == [reqs[0].req_id, reqs[3].req_id, reqs[2].req_id]
    assert gd.req_ids == tuple(r.req_id for r in gd.rows)
    assert [(int(gd.seq_len[i]), int(gd.anchor[i])) for i in range(3)] == [state[0], state[3], state[2]]
    assert gd.active.tolist()[:6] == [True, True, True, False, False, False]
    assert gd.tables[1].tolist() == gd.tables[1].new_tensor(  # the moved row's page table came with it
        eng.blocks.table(reqs[3].req_id) + [0] * (gd.tables.shape[1] - len(eng.blocks.table(reqs[3].req_id)))).tolist()
    gd.retire({r.req_id for r in gd.rows})
    assert gd.rows == [] and not gd.active.any()


def test_kv_pool_is_sized_for_the_batch_and_capped():
    target = tiny_target(3)
    cfg = tiny_engine_config(spec="off", max_num_seqs=4, max_model_len=100, kv_cache_tokens=None)
    eng = Engine(target, None, cfg, None)
    assert eng.blocks.num_pages * eng.blocks.page_size >= 4 * 100
    capped = Engine(target, None, tiny_engine_config(spec="off", max_num_seqs=4, max_model_len=100,
                                                     kv_cache_tokens=64), None)
    assert capped.blocks.num_pages * capped.blocks.page_size == 64
    assert eng.counters()["kv_pool_tokens"] == eng.blocks.num_pages * eng.blocks.page_size
    with pytest.raises(ConfigError, match="engine.kv_memory_fraction"):
        tiny_engine_config(kv_memory_fraction=0.0)
    with pytest.raises(ConfigError, match="engine.kv_cache_tokens"):
        tiny_engine_config(kv_cache_tokens=0)
