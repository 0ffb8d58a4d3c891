"""runners.ab with arms served over HTTP (ab.arms.<arm>.http, runners.ab_http).

End to end: the default A/B (verify-all against ragged) with each arm a runners.serve process on the tiny
models that the runner launches before the arm's block and stops after it, against the same A/B in process.
With stand-in servers (tests/fake_openai_server.py: vLLM's counter names, no token ids): acceptance from the
Prometheus counters, the lossless guard on text, the checks an HTTP arm cannot give said so, an interrupt
that keeps the finished blocks and stops the servers. An arm in process against the same engine served
(ab=in_process_vs_served): the served arm's token ids judged by the in-process guards, a wrong token planted in
them caught. And the configuration mistakes refused by name.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pandas as pd
import pytest

httpx = pytest.importorskip("httpx", reason="the HTTP tests need the test extra: pip install -e '.[test]'")

import runners.ab as ab
from dspark.bench.http.arm import HttpArm
from dspark.config import ConfigError
from dspark.engine import Engine
from runners import ab_http
from runners.common import TINY_MODELS_ENV, tiny_models
from runners.schema import HttpArmSchema, MetricsFlavour
from test_bench_http import FAKE, free_port
from test_configs import ROOT, compose_ab

TINY = ["+workload=agentic", "workload.num_prompts=2", "workload.max_tokens=6", "ab.n_blocks=2",
        "ab.warmup_requests=1", "ab.n_boot=200", "load.concurrency=2", "wandb.mode=disabled",
        "engine.plan_min_rows=0"]  # two rows: the planner runs there only below the default engine.plan_min_rows


def serve_arm(cfg, arm: str, verify: str, out, *extra: str) -> int:
    """Arm ``arm`` of ``cfg`` (ab=http_full_vs_ragged) as runners.serve on the tiny models, on a free port."""
    port = free_port()
    node = cfg.ab.arms[arm].http
    node.base_url, node.metrics_url = f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}/metrics"
    node.launch = [sys.executable, "-m", "runners.serve", f"port={port}", "log_level=warning", f"engine.verify={verify}",
                   "engine.max_num_seqs=2", "engine.plan_min_rows=0", f"hydra.run.dir={out}/servers/{arm}", *extra]
    node.env = {TINY_MODELS_ENV: "1", "PYTHONPATH": str(ROOT)}
    node.cwd = str(out)
    return port


def fake_arm(cfg, arm: str, out, *args: str) -> int:
    port = free_port()
    cfg.ab.arms[arm].http = HttpArmSchema(base_url=f"http://127.0.0.1:{port}/v1", metrics=MetricsFlavour.vllm,
                                          metrics_url=f"http://127.0.0.1:{port}/metrics",
                                          launch=[sys.executable, str(FAKE), str(port), *args], cwd=str(out),
                                          stop_timeout_s=2.0, health_timeout_s=20.0)
    cfg.ab.arms[arm].engine = {}
    return port


def answers(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def test_two_launched_servers_reach_the_in_process_verdict_and_guards(tmp_path):
    """The same workload, seed and engines (the tiny models in fp32, the same steep cost table for the ragged arm)
    in process and behind two launched runners.serve processes. What must hold, and is checked: the same guards
    with the same results, the same verdict, and outputs identical token for token across all four arm runs
    (fp32 greedy decoding is exact). The timings differ (the HTTP arms add a network stack, and the speed
    numbers of the tiny models mean nothing), so the verdict agrees because two block pairs cannot conclude
    either way (the Wilcoxon test needs six): both runs say so. A server is launched for each of its arm's
    blocks (ABBA: A twice; B, set to keep running, once for its two blocks), warmed up, read through /metrics by
    delta, and stopped after its block (B at the run's end)."""
    from test_engine_scheduling import steep_table

    target, drafter, tok = tiny_models()
    in_process = compose_ab(TINY, out_dir=tmp_path / "in_process")
    probe = Engine(target, tok, replace(ab.arm_engine_configs(in_process)["B"], cost_table=None), drafter)
    table = steep_table(probe, tmp_path / "steep.json")
    local = ab.run(compose_ab([*TINY, f"+ab.arms.B.engine.cost_table={table}"], out_dir=tmp_path / "in_process"),
                   engine_factory=ab.tiny_engine_factory)

    out = tmp_path / "http"
    cfg = compose_ab(["ab=http_full_vs_ragged", *TINY], out_dir=out)
    ports = [serve_arm(cfg, "A", "full", out), serve_arm(cfg, "B", "ragged", out, f"engine.cost_table={table}")]
    cfg.ab.arms.B.http.keep_running = True  # B's two blocks on one server (A's are relaunched: both ways run)
    served = ab.run(cfg)

    assert [(g["name"], g["passed"]) for g in served["guards"]] == [(g["name"], g["passed"]) for g in local["guards"]]
    assert [g["name"] for g in served["guards"]] == ["errors", "lossless/block0", "lossless/block1", "did_nothing[A]",
                                                     "did_nothing[B]"]
    assert served["guards_passed"] and local["guards_passed"]
    assert served["verdict"] == local["verdict"] == "inconclusive"
    lossless = {g["name"]: g for g in served["guards"]}["lossless/block0"]
    assert lossless["details"]["compared"] == "token ids" and lossless["details"]["method"] == "exact"
    # The ragged server trimmed, as the in-process arm did: its counters came from its /metrics by delta.
    assert served["counters"]["B"]["trimmed_steps"] > 0 and local["counters"]["B"]["trimmed_steps"] > 0
    assert served["counters"]["A"]["drafted_tokens"] > 0 and served["counters"]["A"]["trimmed_steps"] == 0
    # The planner's predictions against what its steps did, from the server's counters as from the engine's.
    assert set(served["prediction_health"]) == set(local["prediction_health"]) == {"B"}
    did_b = {g["name"]: g for g in served["guards"]}["did_nothing[B]"]
    assert did_b["message"] == {g["name"]: g for g in local["guards"]}["did_nothing[B]"]["message"]
    # Every output identical across the four: in process and served, both arms, both blocks.
    outputs = {}
    for name in ("in_process", "http"):
        requests = pd.read_parquet(tmp_path / name / "requests.parquet")
        for _, r in requests.iterrows():
            outputs.setdefault(r["request_id"], set()).add(tuple(r["output_token_ids"]))
    assert len(outputs) == 2 and all(len(v) == 1 and len(next(iter(v))) > 0 for v in outputs.values())
    served_requests = pd.read_parquet(out / "requests.parquet")
    assert served_requests["ttft_s"].gt(0).all() and served_requests["n_chunks"].gt(1).all()
    assert served_requests["accept_length"].notna().all()  # per-request acceptance from the responses
    blocks = pd.read_csv(out / "blocks.csv")
    assert list(zip(blocks["block"], blocks["arm"])) == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]
    assert set(blocks["acceptance_source"]) == {"responses"}
    # A launched for each of its blocks and stopped after it, B once and kept (the logs end with the server's own
    # shutdown line).
    arms = json.loads((out / "summary.json").read_text())["arms"]
    assert arms["A"]["http"]["launches"] == 2 and arms["B"]["http"]["launches"] == 1
    assert arms["B"]["engine"]["verify"] == "ragged" and arms["B"]["engine"]["cost_table"] == str(table)
    assert served["cost_tables"]["B"]["path"] == str(table) == local["cost_tables"]["B"]["path"]
    assert served["cost_tables"]["B"]["fingerprint"] == local["cost_tables"]["B"]["fingerprint"]
    for log in ("A-1", "A-2", "B-1"):
        assert "stopped (SIGINT)" in (out / "servers" / f"{log}.log").read_text()
    assert not any(answers(p) for p in ports)


def test_foreign_servers_acceptance_from_prometheus_and_what_they_cannot_give(tmp_path):
    """Two stand-in servers with vLLM's counter names and no token ids, on a sampled workload with a greedy
    replica: acceptance by Prometheus delta, the lossless guard on the replicas' text, the distribution check
    and the did_nothing check said not checked (they pass, saying so)."""
    cfg = compose_ab(["+workload=poetry", "workload.num_prompts=2", "workload.max_tokens=8", "ab.n_blocks=1",
                      "ab.warmup_requests=1", "ab.n_boot=200", "load.concurrency=2", "wandb.mode=disabled"],
                     out_dir=tmp_path)
    ports = [fake_arm(cfg, "A", tmp_path), fake_arm(cfg, "B", tmp_path)]
    summary = ab.run(cfg)
    guards = {g["name"]: g for g in summary["guards"]}
    assert list(guards) == ["errors", "lossless/greedy_replicas", "distribution[A]", "distribution[B]",
                            "did_nothing[A]", "did_nothing[B]"]
    assert summary["guards_passed"]
    replicas = guards["lossless/greedy_replicas"]
    assert replicas["details"]["compared"] == "text: arm A and B returned no token ids"
    assert "precision A unknown, B unknown" in replicas["message"]
    for name in ("distribution[A]", "did_nothing[B]"):
        assert guards[name]["message"].startswith("not checked: ") and guards[name]["details"]["state"] == "unchecked"
    assert "spec_decode/num_drafts" in guards["did_nothing[B]"]["message"]
    blocks = pd.read_csv(tmp_path / "blocks.csv")
    assert set(blocks["acceptance_source"]) == {"prometheus"}
    # The stand-in drafts 3 tokens per output character and accepts 2: accept length 3, rate 2/3.
    assert blocks["accept_length"].tolist() == pytest.approx([3.0, 3.0])
    assert blocks["accept_rate"].tolist() == pytest.approx([2 / 3, 2 / 3])
    assert (blocks["counter/spec_decode/num_draft_tokens"] == 3 * blocks["output_tokens"]).all()
    assert summary["counters"]["A"]["spec_decode/num_accepted_tokens"] == 2 * blocks["output_tokens"].iloc[0]
    assert summary["workload"]["length_stats"]["counted_by"] == "the servers (usage.prompt_tokens)"
    assert not any(answers(p) for p in ports)


def test_an_interrupt_in_an_http_block_keeps_the_finished_blocks_and_stops_the_servers(tmp_path, monkeypatch):
    """Ctrl-C in arm B's first block (its server launched): the summary of the finished block, exit 130, both
    servers stopped; a rerun would keep the interrupted run, its servers' logs too, in unfinished-1/."""
    cfg = compose_ab([*TINY, "ab.n_blocks=1"], out_dir=tmp_path)
    ports = [fake_arm(cfg, "A", tmp_path), fake_arm(cfg, "B", tmp_path)]
    run_block = HttpArm.run_block
    calls = []

    def interrupted_second(self, *args, **kw):
        calls.append(self.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return run_block(self, *args, **kw)

    monkeypatch.setattr(HttpArm, "run_block", interrupted_second)
    with pytest.raises(SystemExit) as info:
        ab.run(cfg)
    assert info.value.code == 130 and calls == ["A", "B"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] == {"signal": "SIGINT", "phase": ab.TIMED_BLOCKS, "completed_arm_blocks": 1,
                                      "scheduled_arm_blocks": 2}
    assert len(pd.read_csv(tmp_path / "blocks.csv")) == 1 and (tmp_path / "requests" / "block0_A.parquet").is_file()
    assert not any(answers(p) for p in ports)  # B was launched for its block and stopped on the way out
    # A rerun in the folder first moves the interrupted run's files, its servers' logs among them, to unfinished-1/.
    assert ab.partial_run(tmp_path) and ab.keep_earlier_run(tmp_path) == tmp_path / "unfinished-1"
    kept = tmp_path / "unfinished-1"
    assert len(pd.read_csv(kept / "blocks.csv")) == 1 and sorted(p.name for p in (kept / "servers").glob("*.log")) == [
        "A-1.log", "B-1.log"]


def test_an_in_process_arm_against_a_served_one(tmp_path):
    """Arm A in process (the tiny models), arm B a stand-in server that answers something else: the factory
    builds A only, the runner tokenizes with A's tokenizer, the lossless guard compares text (B returns no ids)
    and fails, naming the difference, after every result is written."""
    from dspark.bench.guards import ABGuardError

    cfg = compose_ab(TINY, out_dir=tmp_path)
    fake_arm(cfg, "B", tmp_path)
    built = []

    def factory(cfg, arm_cfgs):
        built.append(sorted(arm_cfgs))
        return ab.tiny_engine_factory(cfg, arm_cfgs)

    with pytest.raises(ABGuardError, match=r"lossless/block0: 0/2 requests identical \(text: arm B returned no token "
                                           r"ids; precision A float32, B unknown\)"):
        ab.run(cfg, engine_factory=factory)
    assert built == [["A"]]
    summary = json.loads((tmp_path / "summary.json").read_text())
    guards = {g["name"]: g for g in summary["guards"]}
    assert guards["did_nothing[A]"]["passed"] and guards["did_nothing[A]"]["message"].startswith("arm A: every")
    assert guards["did_nothing[B]"]["details"]["state"] == "unchecked" and guards["errors"]["passed"]
    assert "not judged" in guards["lossless/block0"]["message"]
    assert summary["workload"]["length_stats"]["count"] == 2 and "counted_by" not in summary["workload"]["length_stats"]


def test_an_unreachable_server_fails_its_arm_by_name(tmp_path):
    cfg = compose_ab(TINY, out_dir=tmp_path)
    cfg.ab.arms.A.http = HttpArmSchema(base_url=f"http://127.0.0.1:{free_port()}/v1")
    cfg.ab.arms.A.engine = {}
    fake_arm(cfg, "B", tmp_path)
    with pytest.raises(ab.ArmFailed, match=r"arm A could not serve block 0: .*nothing answers at http://127\.0\.0\.1:"
                                           r"\d+/health .*give the arm a launch command"):
        ab.run(cfg)
    assert not (tmp_path / "servers").exists()  # B was never launched


# ---- configuration -------------------------------------------------------------------------------
def test_the_http_ab_config_composes_with_launch_commands_of_this_interpreter(tmp_path):
    cfg = compose_ab(["ab=http_full_vs_ragged", "+workload=poetry", "load.concurrency=4"], out_dir=tmp_path)
    endpoints = ab_http.http_endpoints(cfg)
    assert ab.check_config(cfg)[0] == {}  # no engine in this process
    a, b = endpoints["A"], endpoints["B"]
    assert a.launch[:3] == (sys.executable, "-m", "runners.serve") and "engine.max_num_seqs=4" in a.launch
    assert "engine.verify=full" in a.launch and "engine.verify=ragged" in b.launch and "find_cost_table=true" in b.launch
    assert a.metrics == "dspark" and a.metrics_url.endswith(":8021/metrics") and b.base_url.endswith(":8022/v1")


@pytest.mark.parametrize("overrides,message", [
    (["+ab.arms.B.engine.verify=uniform"], r"ab\.arms\.B\.engine=\{'verify': 'uniform'\} has no effect: arm B is "
                                           r"served over HTTP"),
    (["ab.arms.A.http.metrics_url=localhost/metrics"], r"ab\.arms\.A\.http\.metrics_url: give an http\(s\) URL"),
    (["ab.arms.B.http.base_url=http://127.0.0.1:8021/v1", "ab.arms.B.http.metrics_url=null"],
     r"both reach http://127\.0\.0\.1:8021: two arms need two servers"),
    (["ab.arms.A.http.keep_running=true", "ab.arms.A.http.launch=null"], r"ab\.arms\.A\.http\.keep_running: true "
                                                                         r"needs a launch command"),
])
def test_http_arm_mistakes_are_refused_by_name_before_anything_starts(tmp_path, overrides, message):
    cfg = compose_ab(["ab=http_full_vs_ragged", *TINY, *overrides], out_dir=tmp_path)
    with pytest.raises(ConfigError, match=message):
        ab.run(cfg)
    assert not (tmp_path / "servers").exists()


def test_engine_settings_with_every_arm_over_http_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ab_http, "_task_overrides", lambda: ["ab=http_full_vs_ragged", "engine.dtype=bfloat16"])
    with pytest.raises(ConfigError, match=r"engine\.dtype=bfloat16: no effect, every arm is served over HTTP"):
        ab.check_config(compose_ab(["ab=http_full_vs_ragged", *TINY], out_dir=tmp_path))


def test_a_workload_the_api_cannot_take_is_refused(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Once upon a time"}\n{"prompt": "Dear diary"}\n')
    cfg = compose_ab(["ab=http_full_vs_ragged", *TINY[1:], "+workload=custom", f"workload.path={path}"],
                     out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"ab\.arms\.A\.http\.api=chat: prompt '.*' is a text prompt; set "
                                          r"ab\.arms\.A\.http\.api=completions"):
        ab.run(cfg)


# ---- the guards an HTTP arm changes --------------------------------------------------------------
def test_outputs_that_differ_in_reduced_or_unknown_precision_fail_unjudged():
    ids = {"A": {"p": [5, 6, 7]}, "B": {"p": [5, 6, 8]}}
    texts = {"A": {"p": "abc"}, "B": {"p": "abd"}}
    why = "arm A is served over HTTP"
    g = ab_http.api_lossless_guard("lossless/block0", ids, texts, {"A": "float32", "B": None}, not_rescored=why)
    assert not g.passed and "not judged" in g.message and "precision A float32, B unknown" in g.message
    assert f"cannot judge this run ({why})" in g.message and g.details["not_rescored"] == why
    assert g.details["method"] == "exact, unjudged" and g.details["differences"][0]["first_diff_index"] == 2
    same = ab_http.api_lossless_guard("lossless/block0", {"A": ids["A"], "B": ids["A"]}, texts,
                                      {"A": "bfloat16", "B": None}, not_rescored=why)
    assert same.passed and same.message.startswith("1/1 requests identical (token ids; precision A bfloat16")
    exact = ab_http.api_lossless_guard("x", ids, texts, {"A": "float32", "B": "float32"}, not_rescored=why)
    assert not exact.passed and "not judged" not in exact.message and exact.details["method"] == "exact"
    as_text = ab_http.api_lossless_guard("x", {"A": {"p": None}, "B": ids["B"]}, texts,
                                         {"A": "float32", "B": "float32"}, not_rescored=why)
    assert as_text.details["compared"] == "text: arm A returned no token ids" and not as_text.passed


@pytest.mark.parametrize("a_here,ids_b,dtypes,why", [
    (True, [1, 2], {"A": "bfloat16", "B": None}, None),
    (True, [1, 2], {"A": "float32", "B": "float32"}, None),
    (True, [1, 2], {"A": "bfloat16", "B": "float32"}, None),
    (False, [1, 2], {"A": None, "B": "bfloat16"}, "arm A is served over HTTP"),
    (True, None, {"A": "bfloat16", "B": "bfloat16"}, "arm B returned no token ids"),
    (True, [1, 2], {"A": "float32", "B": "bfloat16"}, "arm A runs in float32, so this run measures no rounding noise "
                                                       "to judge arm B's precision (bfloat16)"),
    (True, [1, 2], {"A": "float32", "B": None}, "arm B's precision (unknown)"),
])
def test_the_reference_guards_judge_a_served_arm_only_where_they_can(a_here, ids_b, dtypes, why):
    """Arm A in this process, every output of the served arm token ids, and a float32 arm A only against a
    float32 server: otherwise (None) the reason the API comparison gives."""
    served = "A" if not a_here else "B"
    arms = ab_http.HttpArms({served: ab_http.HttpEndpoint(base_url="http://127.0.0.1:1/v1")}, ".", 1)
    outputs = {"A": {0: {"p": [1, 2]}}, "B": {0: {"p": [1, 2]}}}
    replicas = {"A": {"r": [3]}, "B": {"r": ids_b}}  # the greedy replicas are read too
    got = ab_http.not_rescored(outputs, replicas, dtypes, arms, a_here)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got, got


# ---- an arm in this process against the same engine served -------------------------------------
def _in_process_vs_served(tmp_path, name: str, *overrides: str, served: tuple[str, ...] = ()):
    """ab=in_process_vs_served on the tiny models: arm A in this process, arm B runners.serve (launched once)."""
    out = tmp_path / name
    own_workload = any(o.startswith("+workload") for o in overrides)
    cfg = compose_ab(["ab=in_process_vs_served", *[o for o in TINY if not (own_workload and o.startswith("+workload"))],
                      *overrides], out_dir=out)
    serve_arm(cfg, "B", "full", out, "spec=dspark", *served)
    return cfg, out


def test_a_served_arm_that_returns_token_ids_is_judged_by_the_in_process_guards(tmp_path, monkeypatch):
    """Arm A in process, arm B the same engine behind runners.serve (token ids from its API). float32, a sampled
    workload with its greedy replica: the exact token-id guard of two in-process arms on the replicas (its message,
    not the API comparison's), and the distribution check run for both arms, B's sampled tokens re-scored with A's
    target. bfloat16, greedy: the evidence guard (one ``lossless`` guard, as for two in-process arms) re-scores
    B's outputs in float32 after A's control run, and a wrong token planted in what B's API returned in block 1 is
    caught: the one real divergence, in B/block1 at the planted position."""
    from dspark.bench.guards import ABGuardError

    cfg, out = _in_process_vs_served(tmp_path, "fp32", "+workload=poetry", "workload.max_tokens=12",
                                     "ab.distribution_min_tokens=12")
    summary = ab.run(cfg, engine_factory=ab.tiny_engine_factory)
    guards = {g["name"]: g for g in summary["guards"]}
    assert list(guards) == ["errors", "lossless/greedy_replicas", "distribution[A]", "distribution[B]",
                            "did_nothing[A]", "did_nothing[B]"] and summary["guards_passed"]
    replicas = guards["lossless/greedy_replicas"]
    assert replicas["message"] == "1/1 requests identical (float32)" and replicas["details"]["method"] == "exact"
    assert replicas["details"]["outputs"]["B"].startswith("served over HTTP, token ids from its API (precision float32")
    for arm in ("A", "B"):  # checked, not "unchecked", on the tokens each arm sampled
        assert guards[f"distribution[{arm}]"]["details"]["state"] == "passed", guards[f"distribution[{arm}]"]
        assert guards[f"distribution[{arm}]"]["details"]["n"] >= 12

    run_block = HttpArm.run_block
    planted = {}

    def wrong_token_in_block1(self, requests, block, **kw):
        run = run_block(self, requests, block, **kw)
        if block == 1:
            r = run.results[0]
            pos = len(r.token_ids) - 1  # the last token: nothing after it is scored on the wrong prefix
            r.token_ids = [*r.token_ids[:pos], (r.token_ids[pos] + 48) % 97]
            planted.update(request_id=r.request_id, position=pos)
        return run

    monkeypatch.setattr(HttpArm, "run_block", wrong_token_in_block1)
    cfg, out = _in_process_vs_served(tmp_path, "bf16", "engine.dtype=bfloat16", served=("engine.dtype=bfloat16",))
    with pytest.raises(ABGuardError, match="lossless: bfloat16; noise bound"):
        ab.run(cfg, engine_factory=ab.tiny_engine_factory)
    summary = json.loads((out / "summary.json").read_text())
    guards = {g["name"]: g for g in summary["guards"]}
    assert list(guards) == ["errors", "lossless", "did_nothing[A]", "did_nothing[B]"]
    assert summary["arms"]["B"]["engine"]["dtype"] == "bfloat16"
    # The served arm names what it ran as the in-process arm does (from runners.serve's /dspark/engine).
    assert summary["arms"]["B"]["models"] == summary["arms"]["A"]["models"]
    g = guards["lossless"]
    assert g["details"]["method"] == "evidence" and g["details"]["control"]["running_limit"] == 1
    assert set(g["details"]["rate_tests"]) == {"A", "B"}  # B's off-reference rate against the control's
    assert [c["runs"] for c in g["details"]["comparisons"]] == [["A/block0", "B/block0"], ["A/block1", "B/block1"]]
    assert [(d["run"], d["request_id"], d["position"]) for d in g["details"]["real_divergences"]] == [
        ("B/block1", planted["request_id"], planted["position"])]
    assert g["details"]["outputs"] == {"A": "in process",
                                       "B": "served over HTTP, token ids from its API (precision bfloat16)"}


def test_a_served_arm_with_several_api_servers_passes_the_guards_and_counts_every_request(tmp_path):
    """ab=in_process_vs_served with B's runners.serve at api_servers=2 (two HTTP processes over one engine
    process): the exact lossless guards and did_nothing pass, and B's per-block counter deltas read over HTTP
    (one scrape, whichever API server answers it) count every request of the block: the same drafts and decode
    steps as the same requests in process."""
    cfg, out = _in_process_vs_served(tmp_path, "api2", "load.concurrency=4", "workload.num_prompts=8",
                                     served=("api_servers=2",))
    summary = ab.run(cfg, engine_factory=ab.tiny_engine_factory)
    assert summary["guards_passed"], [(g["name"], g["message"]) for g in summary["guards"] if not g["passed"]]
    guards = {g["name"]: g for g in summary["guards"]}
    assert [guards[f"lossless/block{i}"]["message"] for i in (0, 1)] == ["8/8 requests identical (float32)"] * 2
    assert guards["did_nothing[B]"]["message"].startswith("arm B: every configured feature engaged")
    assert summary["arms"]["B"]["http"]["launch"][-1] == "api_servers=2"
    blocks = pd.read_parquet(out / "blocks.parquet").set_index(["arm", "block"])
    for block in (0, 1):
        a, b = blocks.loc[("A", block)], blocks.loc[("B", block)]
        assert b["n_requests"] == a["n_requests"] == 8 and b["output_tokens"] == a["output_tokens"]
        assert b["counter/spec_decode/num_draft_tokens"] == a["counter/drafted_tokens"] > 0
        assert b["counter/spec_decode/num_drafts"] == a["counter/request_steps"]
    log = next((out / "servers").glob("B-*.log")).read_text()
    assert "2 API servers" in log, log[-2000:]
