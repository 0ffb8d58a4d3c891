#!/usr/bin/env bash
# Leased-H200 run: does confidence scheduling pay in service, and is speculation with every safeguard ever
# slower than target-only? runners.ab on SmolLM2 bf16, engine=h200_graphs, greedy, 256 new tokens, 4 x C
# requests per block (agentic: its 304 eval prompts sent ceil(4C / 304) times, workload.repeat), N_BLOCKS ABBA
# blocks (default 8). Cost tables are profiled by the first run that needs one and found by the later ones.
#   OUT=/path bash bench/h200_schedule.sh STAGE_DIR      # STAGE_DIR: model.part1..N + model.sha256
# PARTS (default "ragged"):
#   ragged:     ab=full_vs_ragged (verify-all vs ragged) with engine.service_cost=SERVICE_COST (default true) on
#               the B arm, at concurrency CONCS (default "128 256") on WORKLOADS (default "mixed_chat agentic")
#   scheduled:  ab=full_vs_scheduled (verify-all vs ragged + service price + depth down to zero) at the same
#               concurrencies and workloads
#   estimate:   ab=head_vs_max_prob at the same concurrencies and workloads
#   maxprob:    ab=scheduled_vs_max_prob_calibration (the scheduled arm against the same arm with the sts_max_prob
#               calibration in MP_CAL, a temperatures.json from runners.calibrate method=sts_max_prob) at the same
#               concurrencies and workloads
#   topgap:     ab=scheduled_vs_top_gap_calibration (the same with an sts_top_gap calibration: GAP_CAL, from
#               runners.calibrate method=sts_top_gap; default the shipped drafter's) at the same concurrencies and
#               workloads
#   greedytopgap: ab=scheduled_vs_greedy_top_gap_calibration (the same, the sts_top_gap calibration read on all-greedy
#               steps only: engine.greedy_confidence_calibration) at the same concurrencies and workloads
#   forcedtrim: ab=full_vs_forced_trim (verify-all vs the same engine verifying FORCE_FRAC, default 0.75, of every
#               step's drafted cells: what a trim saves in service) at the same concurrencies and workloads
#   share:      ab=full_vs_verify_share (verify-all vs the measured choice between the whole block and SHARE, default
#               0.75, of its cells) at the same concurrencies and workloads
#   online:     ab=scheduled_vs_online_calibration (the scheduled arm against the same arm with the head's
#               calibration corrected online, engine.online_calibration) at the same concurrencies and workloads
#   speculation: ab=spec_off_vs_dspark (target-only vs DSpark verify-all) at SPEC_CONCS (default "1")
#   safeguards: ab=target_vs_scheduled (target-only vs DSpark ragged + service price + depth down to zero) at
#               SAFE_CONCS (default "1 16 128 256")
#   served:     ab=in_process_vs_served (the engine in process vs behind a launched runners.serve, both verify-all)
#               at SERVED_CONCS (default "256"); needs fastapi, uvicorn (with uvloop and httptools), prometheus_client,
#               httpx and aiohttp (SERVE_WHEELS:
#               a folder of wheels installed from when one is missing, default .gpu/serve-wheels); SERVE_EXTRA: more
#               runners.serve overrides for the served arm's server (space-separated, e.g. "prompt_workers=2")
#   http:       ab=http_full_vs_ragged (verify-all vs ragged, each arm a runners.serve on engine=h200_graphs that the
#               runner launches and stops) at CONCS; the in-process verdict to compare it with: PARTS=ragged SERVICE_COST=false
# TAG: a suffix for the run folders; B_EXTRA: more overrides for the ragged part (e.g. "+ab.arms.B.engine.min_verify_len=0");
# AB_EXTRA: overrides for every run (e.g. "ab.profile.batch_sizes=[1,2,4,8,16,32,64,128,256]": one cost table for
# every concurrency, profiled once). agentic (304 eval prompts) and arena_hard (57) repeat their prompts to fill a block.
# A sampled run of a workload without greedy replicas (agentic, arena_hard, mixed_chat at workload.temperature=0.7)
# compares no greedy output, and its lossless guard fails as not judged: add workload.greedy_replica_count=1
# to AB_EXTRA.
# Each run's folder is packed into $OUT/<part>_<workload>_c<C>.tar.gz as soon as it ends (requests/ left out).
# T_RUN (default 300 s) bounds each run; what runs took on the H200 with 8 blocks, the cost table already profiled
# (profiling it adds about 60 s to the first run) and the lossless control and guards included: agentic 256
# 150-175 s, mixed_chat 256 105-115 s, 128 80-90 s, 16 35-45 s (6 blocks), 1 about 45 s. A run cut at T_RUN keeps
# its finished blocks (summary.json marked interrupted, the guards it had not judged left unjudged).
set -uo pipefail
PARTS=" ${PARTS:-ragged} "; has() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:?set OUT}; WORK=${WORK:-/tmp/dspark-schedule}
source "$(dirname "$0")/stage_model.sh" "${1:?stage dir}"
NB=${N_BLOCKS:-8}
if { has served || has http; } && ! python3 -c "import fastapi, uvicorn, uvloop, httptools, prometheus_client, httpx, aiohttp" 2>/dev/null; then
  stamp "install the serving stack from ${SERVE_WHEELS:=.gpu/serve-wheels}"  # resolved against what is installed
  python3 -m pip install -q --no-index --find-links "$SERVE_WHEELS" fastapi uvicorn uvloop httptools prometheus_client \
    httpx aiohttp 2>&1 | grep -v WARNING
fi
run() {  # run PART WORKLOAD CONCURRENCY TIMEOUT [overrides...]
  local part=$1 w=$2 c=$3 t=$4; shift 4
  local n=$(( c * 4 > 16 ? c * 4 : 16 )) name="${part}_${w}_c${c}${TAG:-}" size
  local pool=0  # eval prompts of a workload smaller than a block: each sent as often as the block needs
  case "$w" in agentic) pool=304 ;; arena_hard) pool=57 ;; esac
  if (( pool > 0 )); then
    size="workload.num_prompts=$(( n < pool ? n : pool )) workload.repeat=$(( (n + pool - 1) / pool ))"
  else
    size="workload.num_prompts=$n"
  fi
  stamp "$name: runners.ab $*, $n requests per block, $NB blocks"
  # shellcheck disable=SC2086
  timeout "$t" python3 -m runners.ab engine=h200_graphs +workload="$w" $size workload.max_tokens=256 \
    load.concurrency="$c" ab.n_blocks="$NB" ab.fail_on_guard=false wandb.mode=disabled progress=false \
    paths.cost_tables="$WORK/cost_tables" hydra.run.dir="$WORK/$name" ${AB_EXTRA:-} "$@" 2>&1 | grep -v "WARNING\|warn(" | tail -4
  python3 - "$WORK/$name" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
st = s.get("statistics", {}).get("output_tokens_per_s", {})
print("verdict", s.get("verdict"), "B vs A %+.2f%% (CI %s .. %s, p=%s)" % (st.get("change_pct", float("nan")),
      st.get("ci_low_pct"), st.get("ci_high_pct"), st.get("wilcoxon_p")), "note:", s.get("verdict_note"))
fl = s.get("statistics", {}).get("steady_output_tokens_per_s")
if fl:
    print("at full load: %s B vs A %+.2f%% (CI %s .. %s, p=%s)" % (fl["verdict"], fl["change_pct"], fl.get("ci_low_pct"),
          fl.get("ci_high_pct"), fl.get("wilcoxon_p")))
for arm, c in s["counters"].items():
    keys = [k for k in c if k.startswith(("oracle/headroom", "service_cost/", "plan_gate/", "sched/trim_ratio", "draft_free/",
                                         "host/", "device/", "online_calibration/", "confidence_calibration/",
                                         "verify_share/"))] + \
           ["trimmed_steps", "draft_free_steps", "depth_zero_rows", "decode_steps", "mean_running_batch", "accept_rate"]
    print(arm, s["arms"][arm]["label"], {k: round(c[k], 4) if isinstance(c.get(k), float) else c.get(k) for k in keys})
print("guards", [(g["name"], g["passed"]) for g in s["guards"]], "prediction", json.dumps(s.get("prediction_health"))[:300])
EOF
  tar czf "$OUT/$name.tar.gz" --exclude=requests -C "$WORK" "$name"
}
for w in ${WORKLOADS:-mixed_chat agentic}; do
  for c in ${CONCS:-128 256}; do
    has ragged && run ragged "$w" "$c" "${T_RUN:-300}" ab=full_vs_ragged "+ab.arms.B.engine.service_cost=${SERVICE_COST:-true}" ${B_EXTRA:-}
    has scheduled && run scheduled "$w" "$c" "${T_RUN:-300}" ab=full_vs_scheduled
    has estimate && run estimate "$w" "$c" "${T_RUN:-300}" ab=head_vs_max_prob
    has online && run online "$w" "$c" "${T_RUN:-300}" ab=scheduled_vs_online_calibration
    has share && run share "$w" "$c" "${T_RUN:-300}" ab=full_vs_verify_share "ab.arms.B.engine.verify_share=${SHARE:-0.75}"
    has forcedtrim && run forcedtrim "$w" "$c" "${T_RUN:-300}" ab=full_vs_forced_trim \
      "ab.arms.B.engine.force_budget_frac=${FORCE_FRAC:-0.75}"
    has maxprob && run maxprob "$w" "$c" "${T_RUN:-300}" ab=scheduled_vs_max_prob_calibration \
      "ab.arms.B.engine.confidence_calibration=${MP_CAL:?set MP_CAL for PARTS=maxprob}"
    has topgap && run topgap "$w" "$c" "${T_RUN:-300}" ab=scheduled_vs_top_gap_calibration \
      ${GAP_CAL:+"ab.arms.B.engine.confidence_calibration=$GAP_CAL"}
    has greedytopgap && run greedytopgap "$w" "$c" "${T_RUN:-300}" ab=scheduled_vs_greedy_top_gap_calibration
  done
  if has speculation; then
    for c in ${SPEC_CONCS:-1}; do run speculation "$w" "$c" "${T_RUN:-300}" ab=spec_off_vs_dspark; done
  fi
  if has safeguards; then
    for c in ${SAFE_CONCS:-1 16 128 256}; do run safeguards "$w" "$c" "${T_RUN:-300}" ab=target_vs_scheduled; done
  fi
  if has served; then
    for c in ${SERVED_CONCS:-256}; do
      if [[ -n "${SERVE_EXTRA:-}" ]]; then  # more runners.serve overrides for B's server, e.g. "prompt_workers=2"
        extra=$(printf ",'%s'" $SERVE_EXTRA)
        lb="['\${python:}',-m,runners.serve,'port=8023','log_level=warning','spec=dspark','engine=h200_graphs',"
        lb+="'engine.verify=full','engine.max_num_seqs=$c','hydra.run.dir=$WORK/served_${w}_c${c}${TAG:-}/servers/B'$extra]"
        run served "$w" "$c" "${T_RUN:-300}" ab=in_process_vs_served "ab.arms.B.http.launch=$lb"
      else
        run served "$w" "$c" "${T_RUN:-300}" ab=in_process_vs_served
      fi
    done
  fi
  if has http; then
    for c in ${CONCS:-128 256}; do
      dir="$WORK/http_${w}_c${c}${TAG:-}/servers"
      la="['\${python:}',-m,runners.serve,'port=8021','log_level=warning','spec=dspark','engine=h200_graphs',"
      la+="'engine.verify=full','engine.max_num_seqs=$c','hydra.run.dir=$dir/A']"
      lb="['\${python:}',-m,runners.serve,'port=8022','log_level=warning','spec=dspark','engine=h200_graphs',"
      lb+="'engine.verify=ragged','engine.max_num_seqs=$c','find_cost_table=true','paths.cost_tables=$WORK/cost_tables',"
      lb+="'hydra.run.dir=$dir/B']"
      run http "$w" "$c" "${T_RUN:-300}" ab=http_full_vs_ragged "ab.arms.A.http.launch=$la" "ab.arms.B.http.launch=$lb"
    done
  fi
done
stamp done
