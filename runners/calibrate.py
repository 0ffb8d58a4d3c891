"""Calibrate a trained drafter's confidence head by sequential temperature scaling (STS).

    python -m runners.calibrate checkpoint=runs/dspark/final data=training_data/calib.safetensors fit_fraction=0.5
    python -m runners.calibrate checkpoint=DIR data=training_data/train.safetensors holdout_fraction=0.05
    python -m runners.calibrate checkpoint=DIR data=... fit_fraction=0.5 method=sts_bias
    python -m runners.calibrate checkpoint=DIR data=... fit_fraction=0.5 method=sts_max_prob
    python -m runners.calibrate checkpoint=DIR data=... fit_fraction=0.5 method=sts_top_gap

``method=sts`` (default): one temperature per position, c_k = sigmoid(z_k / T_k).
``method=sts_bias``: a temperature AND a bias per position, c_k = sigmoid(z_k / T_k + b_k), fitted
left to right by a 2-D grid search (``n_bias`` biases in [-b_max, b_max] x the temperature grid, then a
``refine`` x ``refine`` grid around the optimum; candidates within ``ece_tolerance`` of the smallest ECE
go to the lowest Brier score, so the fit cannot flatten c_k to a constant); for a head whose raw
confidence is biased, which a temperature alone cannot fix. The biases go into temperatures.json
("biases"), which DSparkDrafter.load reads. ``method=sts_max_prob``: the head's logit AND the
drafter's own top-token probability p_k (the replay's ``draft_max_prob``), per position
c_k = sigmoid(a_k z_k + w_k logit(p_k) + b_k), a logistic regression fitted by maximum likelihood on the
reached cells (:func:`dspark.training.calibration.fit_max_prob_calibration`); temperatures.json holds
T_k = 1 / a_k, the biases and "max_prob_weights", and the engine then feeds each slot's top probability to
the head's calibration. Its report's ``auc_per_position`` / ``auc_overall`` are the fused confidence's,
``head_auc`` the head's alone, ``draft_max_prob_auc`` the max probability's alone. A replay's report also gives
``draft_top_gap_auc``: the AUC of the gap between the drafter's two largest logits, a score that needs no softmax
(a replay cached before the replay kept the gap has none). ``method=sts_top_gap`` is the same fit on that gap
g_k in place of logit(p_k), c_k = sigmoid(a_k z_k + v_k g_k + b_k)
(:func:`dspark.training.calibration.fit_top_gap_calibration`; "top_gap_weights" in temperatures.json): the engine
takes the gap from the greedy argmax's own pass, with no softmax. ``replay_cache=FILE.pt`` keeps the greedy replay
(the slow part) so that every method can be fitted on the same blocks without replaying twice.

On held-out sequences (calibration data made by ``runners.make_training_data`` from train-split
prompts the drafter never saw, ``exclude_prompts=`` the drafter's ``training_prompts.json``; or
the part of a training file that ``runners.train_drafter data_holdout_fraction=F`` kept out:
same fraction and seed), the drafter drafts greedily at anchors and the target verifies every
full block greedily (:func:`dspark.training.trainer.replay_block_acceptance`). ``replay_temperature=T`` > 0
replays sampled traffic instead: the drafter draws each slot at temperature T and the target accepts it by
rejection sampling at T, so the fit (or the checkpoint's own calibration, judged on the same blocks as
``previous_temperatures``) describes rows that sample at T.
``anchors_per_seq=null`` takes every response position (every ``anchor_stride``-th), in passes
of ``anchor_chunk`` anchors per sequence so memory stays bounded.

With ``fit_fraction=F`` the sequences are split (seeded, by sequence) into a fit part (F)
and a report part: STS is fitted on the fit part only, AUC / ECE before and after are reported
on both (``in_sample`` = fit part, ``out_of_sample`` = report part), the top-level numbers are
the out-of-sample ones, and a bootstrap over the report part's sequences gives a confidence
interval for the out-of-sample ECE after STS, compared with ``target_ece`` (``target_ece_verdict``: met, not
met, undecided, or unresolvable where the interval cannot decide: a noise floor above the target that the
interval reaches down to, or reported blocks whose drafts were all rejected or all accepted, where a constant
survival scores a perfect ECE). The temperatures written are the ones fitted on the fit part (documented
choice: refitting on all data would leave no unbiased estimate of the temperatures that ship). Without
``fit_fraction`` STS is fitted and reported on the same blocks (in-sample only; the older behaviour).

``traces=[...]`` fits on step traces instead (``runners.bench_decode step_trace=true
engine.cuda_graphs=false`` with ``verify=full``): the blocks the engine itself drafted and
verified greedily on a workload, with their raw confidence logits, split by request. That
calibrates the head for the workload it will schedule (a head calibrated on one workload is
off on another whose acceptance differs); trace prompts the benchmark does not use
(``workload_split=train``), and calibrate a copy of the checkpoint folder.

``temperatures.json`` is written into the checkpoint folder, ``calibration.json`` and a
reliability diagram ``reliability.png`` (of the report part when split) beside it by default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from dspark.config import ConfigError, ModelConfig
from dspark.model_runner import DTYPES
from dspark.models.drafter import DSparkDrafter
from dspark.models.llama import TargetModel
from dspark.training.calibration import (METHODS, bootstrap_ece, calibration_report, conditional_auc,
                                         fit_max_prob_calibration, fit_sequential_temperatures,
                                         fit_sequential_temperatures_biases, fit_top_gap_calibration,
                                         reliability_plot, save_temperatures, split_sequences)
from dspark.training.data import TokenDataset
from dspark.training.trainer import replay_block_acceptance
from runners.hydra_main import runner_main
from runners.make_training_data import CALIBRATION_EVAL_SOURCES
from runners.schema import ModelSchema


@dataclass
class CalibrateSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    # the drafter folder (config.json + safetensors) to calibrate; temperatures.json is written into it
    checkpoint: Optional[str] = None
    # held-out sequences: a .safetensors file of runners.make_training_data or a list of them (shards, joined in
    # order), as given to train_drafter; replayed greedily (the drafter drafts, the target verifies)
    data: Any = None
    # or: step traces of verify=full engine runs (bench_decode step_trace=true), a path or a list; the blocks
    # the engine drafted and verified on a workload, fitted as they are (no replay, no target model)
    traces: Any = None
    # take only the part of data that train_drafter held out: its data_holdout_fraction; null: all of data
    holdout_fraction: Optional[float] = None
    holdout_seed: int = 0  # the held-out part's seed: train_drafter's data_holdout_seed
    max_sequences: Optional[int] = None  # replay at most the first this many sequences (>= 1); null: all
    # drafted blocks per sequence (a seeded sample of its response positions); null: every response position
    # (every anchor_stride-th)
    anchors_per_seq: Optional[int] = 16
    anchor_stride: int = 1  # anchors only at every stride-th position from the response start (>= 1)
    anchor_chunk: Optional[int] = 32  # anchors per sequence per draft+verify pass (memory bound); null: all at once
    batch_size: int = 8  # sequences per target context pass of the replay
    # tokens per sequence at most (>= 2); a longer sequence is cropped to a window that keeps its last
    # max_len/4 prompt tokens
    max_len: int = 1024
    device: str = "cpu"  # where the replay runs: cpu, cuda or cuda:N
    dtype: str = "float32"  # float32 | bfloat16 | float16: the target's and the drafter's dtype in the replay
    seed: int = 0  # seeds the anchors, and the split and the bootstrap unless split_seed / bootstrap_seed are set
    n_grid: int = 100  # candidate temperatures per position, log-spaced in [t_min, t_max] (>= 2)
    t_min: float = 0.2  # the smallest candidate temperature (> 0)
    t_max: float = 10.0  # the largest candidate temperature (> t_min)
    n_bins: int = 15  # equal-width confidence bins of the ECE and the reliability diagram (>= 1)
    # sts: a temperature per position, c_k = sigmoid(z_k / T_k) | sts_bias: a temperature and a bias per position,
    # c_k = sigmoid(z_k / T_k + b_k) (the biases go into temperatures.json too) | sts_max_prob: the head and the
    # drafter's top-token probability p_k, c_k = sigmoid(z_k / T_k + b_k + w_k logit(p_k)), maximum likelihood on
    # the reached cells (the weights go into temperatures.json as max_prob_weights) | sts_top_gap: the same with the
    # gap g_k between the drafter's two largest logits, c_k = sigmoid(z_k / T_k + b_k + v_k g_k) (top_gap_weights)
    method: str = "sts"
    n_bias: int = 81  # sts_bias: odd number of biases in [-b_max, b_max]
    b_max: float = 4.0  # sts_bias: the bias grid's half-width, in logit units (> 0)
    refine: int = 21  # sts_bias: refinement grid per axis around the coarse optimum (0/1: none)
    ece_tolerance: float = 0.002  # sts_bias: ECE near-ties (absolute) go to the lower Brier score; 0: pure argmin
    replay_cache: Optional[str] = None  # .pt file: reuse the greedy replay (same data/anchors/drafter), else write it
    # > 0: replay sampled traffic (drafts drawn at this temperature, verified by rejection sampling at it), the
    # acceptance of rows that sample at T; 0: greedy drafts and verification
    replay_temperature: float = 0.0
    # (0, 1): fit on this share of the sequences (seeded split by sequence), report ECE out of sample on the rest;
    # the temperatures written are the fit part's. null: fit and report on all blocks (in sample)
    fit_fraction: Optional[float] = None
    split_seed: Optional[int] = None  # seeds the fit/report split; null: seed
    bootstrap_resamples: int = 200  # by-sequence bootstrap resamples of the reported ECE after fitting; 0: no interval
    bootstrap_seed: Optional[int] = None  # seeds the bootstrap; null: seed
    confidence: float = 0.95  # coverage of the bootstrap's percentile interval, in (0, 1)
    target_ece: float = 0.02  # the ECE aim, a fraction (0.02: 2%); calibration.json says whether the interval meets it
    output_json: Optional[str] = None  # the report; null: CHECKPOINT/calibration.json
    # the reliability diagram (.png; of the report part when split); null: CHECKPOINT/reliability.png
    plot: Optional[str] = None
    progress: bool = True  # a progress bar over the replay


ConfigStore.instance().store(name="calibrate_schema", node=CalibrateSchema)


def check_options(cfg: Any) -> None:
    """Reject bad values before any model is loaded; every message names the key and the fix."""

    def integer(key: str, minimum: int, allow_none: bool = False) -> None:
        value = cfg.get(key)
        if value is None and allow_none:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{key}: must be an integer >= {minimum}{' or null' if allow_none else ''}, got {value!r}")

    integer("anchors_per_seq", 1, allow_none=True)
    integer("anchor_stride", 1)
    integer("anchor_chunk", 1, allow_none=True)
    integer("batch_size", 1)
    integer("max_len", 2)
    integer("n_bins", 1)
    integer("bootstrap_resamples", 0)
    integer("max_sequences", 1, allow_none=True)
    method = cfg.get("method", "sts")
    if method not in METHODS:
        raise ConfigError(f"method: {method!r} is not one of {sorted(METHODS)} (sts: a temperature per position; "
                          f"sts_bias: a temperature and a bias per position; sts_max_prob: the head and the "
                          f"drafter's top-token probability, a logistic fit per position; sts_top_gap: the head and "
                          f"the gap between the drafter's two largest logits, likewise)")
    if method == "sts_bias":
        integer("refine", 0)
        n_bias = cfg.get("n_bias", 81)
        if isinstance(n_bias, bool) or not isinstance(n_bias, int) or n_bias < 3 or n_bias % 2 == 0:
            raise ConfigError(f"n_bias: must be an odd integer >= 3 (so that bias 0 is a candidate), got {n_bias!r}")
        b_max = cfg.get("b_max", 4.0)
        if isinstance(b_max, bool) or not isinstance(b_max, (int, float)) or not 0.0 < float(b_max) < float("inf"):
            raise ConfigError(f"b_max: must be a finite number > 0 (biases are searched in [-b_max, b_max]), "
                              f"got {b_max!r}")
        tol = cfg.get("ece_tolerance", 0.002)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 <= float(tol) < 1.0:
            raise ConfigError(f"ece_tolerance: must be in [0, 1) (e.g. 0.002; 0: pure ECE argmin), got {tol!r}")
    f = cfg.get("fit_fraction")
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < float(f) < 1.0):
        raise ConfigError(f"fit_fraction: must be strictly between 0 and 1 (e.g. 0.5: fit STS on half of the "
                          f"sequences, report on the other half) or null (fit and report on all), got {f!r}")
    c = cfg.get("confidence", 0.95)
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 < float(c) < 1.0:
        raise ConfigError(f"confidence: must be strictly between 0 and 1 (e.g. 0.95), got {c!r}")
    t = cfg.get("target_ece", 0.02)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < float(t) < 1.0:
        raise ConfigError(f"target_ece: must be strictly between 0 and 1 (e.g. 0.02), got {t!r}")
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype: {cfg.dtype!r} not in {list(DTYPES)}")
    rt = cfg.get("replay_temperature", 0.0)
    if isinstance(rt, bool) or not isinstance(rt, (int, float)) or not 0.0 <= float(rt) < float("inf"):
        raise ConfigError(f"replay_temperature: must be a finite number >= 0 (0: a greedy replay; e.g. 0.7: the "
                          f"acceptance of rows that sample at 0.7), got {rt!r}")
    if float(rt) > 0 and cfg.get("traces"):
        raise ConfigError("replay_temperature: traces are the engine's own blocks, replayed by nothing; trace "
                          "sampled traffic instead, or give data=")


def held_out_data(cfg: Any) -> TokenDataset:
    if not cfg.data:
        raise ConfigError("data: give held-out sequences, e.g. data=training_data/calib.safetensors (made by "
                          "`python -m runners.make_training_data exclude_prompts=DRAFTER/training_prompts.json ...`)")
    dataset = TokenDataset.load_many(cfg.data)  # one file, or the list of shards the training run used
    if cfg.holdout_fraction:
        _, dataset = dataset.split_holdout(float(cfg.holdout_fraction), int(cfg.holdout_seed))
    elif dataset.info.get("split") == "train" and not dataset.info.get("exclude_prompts"):
        print(f"warning: {cfg.data} holds TRAIN-split prompts and no holdout_fraction is set; calibrate on "
              f"data the drafter did not train on (make_training_data exclude_prompts=..., or the training "
              f"run's holdout)")
    elif dataset.info.get("split") == "eval" and set(dataset.source_names) - set(CALIBRATION_EVAL_SOURCES):
        benchmarks = sorted(set(dataset.source_names) - set(CALIBRATION_EVAL_SOURCES))
        print(f"warning: {cfg.data} holds EVAL-split prompts of {benchmarks}: calibrating on them is not disjoint "
              f"from the evaluation prompts; use the eval split of the training-only sources "
              f"{CALIBRATION_EVAL_SOURCES}, or make_training_data split=train exclude_prompts=...")
    if cfg.max_sequences is not None:
        dataset = dataset.subset(range(min(int(cfg.max_sequences), len(dataset))))
    if cfg.get("fit_fraction") is not None and len(dataset) < 4:
        raise ConfigError(f"fit_fraction={cfg.fit_fraction}: {len(dataset)} held-out sequences cannot be split "
                          f"into a fit part and a report part of at least 2 each; give more data or "
                          f"fit_fraction=null")
    return dataset


def write_temperatures(checkpoint: Path, temperatures: torch.Tensor, drafter: DSparkDrafter, *,
                       ece_before: float | None = None, ece_after: float | None = None,
                       biases: torch.Tensor | None = None, max_prob_weights: torch.Tensor | None = None,
                       top_gap_weights: torch.Tensor | None = None) -> Path:
    """Write temperatures.json (calibration.save_temperatures' format, which DSparkDrafter.load reads).

    ``biases`` None: an STS file (no "biases" key); ``max_prob_weights``: an sts_max_prob file;
    ``top_gap_weights``: an sts_top_gap file."""
    values = [float(t) for t in temperatures]
    bias_values = None if biases is None else [float(b) for b in biases]
    weights = None if max_prob_weights is None else [float(w) for w in max_prob_weights]
    gap_weights = None if top_gap_weights is None else [float(w) for w in top_gap_weights]
    drafter.set_confidence_temperatures(values, bias_values, weights, gap_weights)  # validates count and range
    return save_temperatures(checkpoint, values, ece_before=ece_before, ece_after=ece_after, biases=bias_values,
                             max_prob_weights=weights, top_gap_weights=gap_weights)


def _verdict(interval: dict[str, Any], target: float, accepted: torch.Tensor) -> str:
    """The ECE interval against ``target``; ``accepted``: the reported blocks' acceptance labels [blocks, G]."""
    pct = f"{100 * interval['confidence']:.0f}%"
    hits = int(accepted.sum())
    if hits == 0 or hits == accepted.numel():
        # a survival of 0 (or 1) everywhere scores a perfect ECE here and says nothing the planner could use
        which = "no accepted" if hits == 0 else "no rejected"
        return (f"unresolvable: the {interval['blocks']} reported blocks hold {which} draft, so no calibration "
                f"can be told from a constant; use data the drafter was trained for")
    floor = interval.get("noise_floor", 0.0)
    if floor >= target and interval["high"] > target and interval["low"] <= floor:
        return (f"unresolvable: a perfectly calibrated predictor would score {100 * floor:.2f}% "
                f"on these {interval['blocks']} blocks (noise floor >= {100 * target:.2f}%); add held-out data")
    if interval["high"] <= target:
        return f"met: the {pct} interval's upper end {100 * interval['high']:.2f}% is <= {100 * target:.2f}%"
    if interval["low"] > target:
        return f"not met: the {pct} interval's lower end {100 * interval['low']:.2f}% is > {100 * target:.2f}%"
    return (f"undecided: the {pct} interval [{100 * interval['low']:.2f}%, {100 * interval['high']:.2f}%] "
            f"straddles {100 * target:.2f}%")


def _replay_key(cfg: Any, dataset: TokenDataset, checkpoint: Path) -> dict[str, Any]:
    """What a cached greedy replay depends on: the data, the anchors and the drafter's weights."""
    import hashlib

    digest = hashlib.sha256()
    weights = sorted(checkpoint.glob("*.safetensors")) + sorted(checkpoint.glob("*.safetensors.xz"))
    for f in weights + [checkpoint / "config.json"]:
        if f.is_file():
            digest.update(f.name.encode() + f.read_bytes())
    data = cfg.data if isinstance(cfg.data, str) else [str(d) for d in cfg.data]
    return {"data": data, "holdout_fraction": cfg.get("holdout_fraction"), "holdout_seed": cfg.get("holdout_seed"),
            "max_sequences": cfg.get("max_sequences"), "sequences": len(dataset),
            "anchors_per_seq": cfg.anchors_per_seq, "anchor_stride": int(cfg.get("anchor_stride", 1)),
            "batch_size": int(cfg.batch_size), "max_len": int(cfg.max_len), "seed": int(cfg.seed),
            "device": str(cfg.device), "dtype": str(cfg.dtype), "drafter_sha256": digest.hexdigest(),
            # only a sampled replay names its temperature, so greedy caches written before keep their key
            **({"replay_temperature": float(cfg.replay_temperature)} if cfg.get("replay_temperature") else {})}


def greedy_replay(target: TargetModel, drafter: DSparkDrafter, dataset: TokenDataset, checkpoint: Path,
                  cfg: Any) -> dict[str, Any]:
    """The draft + verify replay (greedy, or sampled at ``cfg.replay_temperature``), or the one ``cfg.replay_cache``
    holds for the same key (else written there)."""
    cache = cfg.get("replay_cache")
    key = _replay_key(cfg, dataset, checkpoint) if cache else None
    if cache and Path(cache).is_file():
        stored = torch.load(cache, map_location="cpu", weights_only=True)
        if stored.get("key") != json.dumps(key, sort_keys=True):
            raise ConfigError(f"replay_cache: {cache} was written for other data, anchors or drafter weights "
                              f"({stored.get('key')}; now {json.dumps(key, sort_keys=True)}); delete it or give "
                              f"another path")
        print(f"replay_cache: reusing the greedy replay in {cache}")
        return stored["replay"]
    replay = replay_block_acceptance(target, drafter, dataset, max_len=int(cfg.max_len),
                                     temperature=float(cfg.get("replay_temperature", 0.0)),
                                     anchors_per_seq=cfg.anchors_per_seq, batch_size=int(cfg.batch_size),
                                     seed=int(cfg.seed), progress=bool(cfg.progress),
                                     anchor_stride=int(cfg.get("anchor_stride", 1)),
                                     anchor_chunk=cfg.get("anchor_chunk"))
    if cache:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"key": json.dumps(key, sort_keys=True), "replay": replay}, cache)
    return replay


def _trace_paths(cfg: Any) -> list[str]:
    """``cfg.traces`` as a list of paths (one path or a list may be given)."""
    return [cfg.traces] if isinstance(cfg.traces, str) else [str(p) for p in cfg.traces]


def trace_replay(cfg: Any) -> dict[str, Any]:
    """The calibration rows of ``cfg.traces`` (dspark.step_trace.calibration_rows), or a ConfigError that says why not."""
    from dspark.step_trace import calibration_rows

    paths = _trace_paths(cfg)
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise ConfigError(f"traces: {missing} not found; write traces with `python -m runners.bench_decode "
                          f"step_trace=true engine.cuda_graphs=false ...` (files step_trace_*.npz)")
    try:
        return calibration_rows(paths)
    except ValueError as e:
        raise ConfigError(f"traces: {e}") from None


# the methods that weigh a drafter score beside the head: method -> (the score's keyword, its fit)
SCORED_METHODS = {"sts_max_prob": ("max_prob", fit_max_prob_calibration),
                  "sts_top_gap": ("top_gap", fit_top_gap_calibration)}
SCORE_MEANING = {"max_prob": "the drafter's top-token probability per slot",
                 "top_gap": "the gap between the drafter's two largest logits per slot"}


def _score_of(replay: dict[str, Any], cfg: Any, method: str) -> torch.Tensor:
    """The replay's score that ``method`` weighs (draft_max_prob, draft_top_gap), or a ConfigError that says how
    to get it."""
    score = SCORED_METHODS[method][0]
    key = f"draft_{score}"
    if key in replay:
        return replay[key].double()
    if cfg.get("traces"):
        how = ("trace the run again (Engine.start_step_trace records it), or calibrate on data= (the greedy replay "
               "records it)" if score == "max_prob" else "calibrate on data= (the greedy replay records it)")
        raise ConfigError(f"method={method}: the traces hold no {key} ({SCORE_MEANING[score]}); {how}")
    raise ConfigError(f"method={method}: the replay holds no {key} ({SCORE_MEANING[score]}); delete "
                      f"replay_cache={cfg.get('replay_cache')} so that the replay runs again")


def calibrate(target: TargetModel | None, drafter: DSparkDrafter, dataset: TokenDataset | None, checkpoint: Path,
              cfg: Any,
              previous: list[float] | None = None, previous_biases: list[float] | None = None,
              previous_weights: list[float] | None = None,
              previous_gap_weights: list[float] | None = None) -> dict[str, Any]:
    """Fit STS, sts_bias, sts_max_prob or sts_top_gap (on the fit part when ``cfg.fit_fraction`` is set), write
    temperatures.json into ``checkpoint``, return the report. ``previous*``: the calibration the checkpoint
    held, judged on the same reported blocks."""
    if drafter.confidence_head is None:
        raise ConfigError(f"checkpoint {checkpoint}: this drafter has no confidence head (DFlash-style ablation); "
                          f"there is nothing to calibrate")
    seed = int(cfg.seed)
    method = cfg.get("method", "sts")
    replay = trace_replay(cfg) if cfg.get("traces") else greedy_replay(target, drafter, dataset, checkpoint, cfg)
    z, accepted = replay["conf_logits"].double(), replay["accepted"].double()
    score = _score_of(replay, cfg, method) if method in SCORED_METHODS else None
    seq_index = replay["seq_index"]
    n_bins = int(cfg.n_bins)
    fit_fraction = cfg.get("fit_fraction")
    if fit_fraction is not None:
        split_seed = seed if cfg.get("split_seed") is None else int(cfg.split_seed)
        try:
            fit, rep = split_sequences(seq_index, float(fit_fraction), split_seed)
        except ValueError as e:
            raise ConfigError(f"fit_fraction: {e}") from None
    else:
        split_seed = None
        fit = rep = torch.ones(z.shape[0], dtype=torch.bool)
    weights = None
    if method in SCORED_METHODS:
        score_name, fit_scored = SCORED_METHODS[method]
        try:
            cal = fit_scored(z[fit], score[fit], accepted[fit])
        except ValueError as e:
            raise ConfigError(f"method={method}: {e}") from None
        temperatures, biases = cal.temperatures, cal.biases
        weights = cal.max_prob_weights if score_name == "max_prob" else cal.top_gap_weights
    elif method == "sts_bias":
        temperatures, biases = fit_sequential_temperatures_biases(
            z[fit], accepted[fit], n_grid=int(cfg.n_grid), t_min=float(cfg.t_min), t_max=float(cfg.t_max),
            n_bias=int(cfg.get("n_bias", 81)), b_max=float(cfg.get("b_max", 4.0)), refine=int(cfg.get("refine", 21)),
            ece_tolerance=float(cfg.get("ece_tolerance", 0.002)), n_bins=n_bins)
    else:
        temperatures = fit_sequential_temperatures(z[fit], accepted[fit], n_grid=int(cfg.n_grid),
                                                   t_min=float(cfg.t_min), t_max=float(cfg.t_max), n_bins=n_bins)
        biases = None
    def fused(mask: torch.Tensor) -> dict[str, Any]:  # sts_max_prob / sts_top_gap: the score of these blocks
        return {} if weights is None else {score_name: score[mask], f"{score_name}_weights": weights}

    in_sample = calibration_report(z[fit], accepted[fit], temperatures, biases, n_bins=n_bins, **fused(fit))
    out_of_sample = calibration_report(z[rep], accepted[rep], temperatures, biases, n_bins=n_bins, **fused(rep))
    report = dict(out_of_sample)  # top level: the reported part (out of sample when split)
    if "draft_max_prob" in replay:  # a head-free estimate on the same blocks: does the head rank acceptance better?
        report["draft_max_prob_auc"] = conditional_auc(replay["draft_max_prob"].double()[rep], accepted[rep])
    if "draft_top_gap" in replay:  # the same question for a score that needs no softmax
        report["draft_top_gap_auc"] = conditional_auc(replay["draft_top_gap"].double()[rep], accepted[rep])
    interval = None
    if int(cfg.get("bootstrap_resamples", 0)) > 0:
        boot_seed = seed if cfg.get("bootstrap_seed") is None else int(cfg.bootstrap_seed)
        kw = dict(n_resamples=int(cfg.bootstrap_resamples), seed=boot_seed, n_bins=n_bins,
                  confidence=float(cfg.get("confidence", 0.95)))
        try:
            interval = {"ece_after": bootstrap_ece(z[rep], accepted[rep], temperatures, seq_index[rep], biases=biases,
                                                   **fused(rep), **kw),
                        "ece_before": bootstrap_ece(z[rep], accepted[rep], torch.ones_like(temperatures),
                                                    seq_index[rep], **kw)}
        except ValueError as e:  # fewer than 2 sequences without a split
            interval = {"skipped": str(e)}
    before_refit = None
    old_biases = None
    old_name, old_weights = (("max_prob", previous_weights) if previous_weights is not None else
                             ("top_gap", previous_gap_weights) if previous_gap_weights is not None else (None, None))
    if previous_biases is not None and (any(abs(v) > 1e-12 for v in previous_biases) or old_weights is not None):
        old_biases = torch.tensor(previous_biases, dtype=torch.float64)
    old_score = None if old_weights is None else replay.get(f"draft_{old_name}")
    if old_weights is not None and old_score is None:
        before_refit = {"temperatures": [float(v) for v in previous], "biases": [float(v) for v in previous_biases],
                        f"{old_name}_weights": [float(v) for v in old_weights],
                        "skipped": f"the previous calibration (sts_{old_name}) weighs {SCORE_MEANING[old_name]}, "
                                   f"which these blocks do not hold"}
    elif previous is not None and (any(abs(v - 1.0) > 1e-12 for v in previous) or old_biases is not None):
        # the calibration the checkpoint held before this run, judged on the same reported blocks
        old = torch.tensor(previous, dtype=torch.float64)
        old_fused = ({} if old_weights is None else
                     {old_name: old_score.double()[rep], f"{old_name}_weights": old_weights})
        old_report = calibration_report(z[rep], accepted[rep], old, old_biases, n_bins=n_bins, **old_fused)
        before_refit = {"temperatures": [float(v) for v in previous], "ece_after": old_report["ece_after"],
                        "ece_after_per_position": old_report["ece_after_per_position"]}
        if old_biases is not None:
            before_refit["biases"] = [float(v) for v in previous_biases]
        if old_weights is not None:
            before_refit[f"{old_name}_weights"] = [float(v) for v in old_weights]
        if int(cfg.get("bootstrap_resamples", 0)) > 0 and interval is not None and "ece_after" in interval:
            before_refit["bootstrap"] = bootstrap_ece(z[rep], accepted[rep], old, seq_index[rep], biases=old_biases,
                                                      **old_fused, **kw)
    part = "report" if fit_fraction is not None else "all (in-sample: fitted and reported on the same blocks)"
    write_temperatures(checkpoint, temperatures, drafter, ece_before=report.get("ece_before"),
                       ece_after=report.get("ece_after"), biases=biases, **({} if weights is None else
                                                                            {f"{score_name}_weights": weights}))
    plot_path = Path(cfg.plot) if cfg.plot else checkpoint / "reliability.png"
    name = ("STS" if biases is None else "STS+bias" if weights is None else
            "head+max prob" if score_name == "max_prob" else "head+top gap")
    title = (f"out of sample: {name} fitted on the fit part, shown on the report part" if fit_fraction is not None
             else f"in sample: {name} fitted and shown on the same blocks")
    reliability_plot(z[rep], accepted[rep], temperatures, plot_path, n_bins=n_bins, title=title, biases=biases,
                     **fused(rep))
    n_seq = lambda mask: int(torch.unique(seq_index[mask]).numel())  # noqa: E731
    num_sequences = len(dataset) if dataset is not None else int(torch.unique(seq_index).numel())
    report.update({
        "checkpoint": str(checkpoint.resolve()),
        "reported_on": part,
        "temperatures_fitted_on": "fit" if fit_fraction is not None else "all",
        "method_option": method,
        "sequences": num_sequences,
        "blocks": int(z.shape[0]),
        "anchors": {"anchors_per_seq": cfg.anchors_per_seq, "anchor_stride": int(cfg.get("anchor_stride", 1)),
                    "max_len": int(cfg.max_len), "seed": seed},
        "greedy_mean_accept_length": float(replay["accept_length"].mean()),
        "replay_temperature": float(cfg.get("replay_temperature") or 0.0),
        "reliability_plot": str(plot_path.resolve()),
        "data_info": ({"traces": _trace_paths(cfg)} if dataset is None else
                      {k: dataset.info.get(k) for k in ("split", "seed", "sources", "exclude_prompts",
                                                         "num_prompts_per_source", "max_tokens") if k in dataset.info}),
    })
    if fit_fraction is not None:
        report["split"] = {
            "by": "sequence", "fit_fraction": float(fit_fraction), "seed": split_seed,
            "sequences": {"fit": n_seq(fit), "report": n_seq(rep)},
            "blocks": {"fit": int(fit.sum()), "report": int(rep.sum())},
            "sequences_without_blocks": num_sequences - n_seq(fit) - n_seq(rep),
        }
        report["in_sample"] = {"part": "fit", "blocks": int(fit.sum()), "sequences": n_seq(fit), **in_sample}
        report["out_of_sample"] = {"part": "report", "blocks": int(rep.sum()), "sequences": n_seq(rep),
                                   **out_of_sample}
    if before_refit is not None:
        report["previous_temperatures"] = before_refit
    if interval is not None:
        report["bootstrap"] = interval
        if "ece_after" in interval:
            report["target_ece"] = float(cfg.get("target_ece", 0.02))
            report["target_ece_verdict"] = _verdict(interval["ece_after"], report["target_ece"], accepted[rep])
    out_json = Path(cfg.output_json) if cfg.output_json else checkpoint / "calibration.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(report, indent=2) + "\n")
    report["output_json"] = str(out_json.resolve())
    return report


def run(cfg: Any, target: TargetModel | None = None) -> dict[str, Any]:
    """Calibrate cfg.checkpoint; ``target`` overrides loading cfg.model (tests pass a tiny one)."""
    if not cfg.checkpoint:
        raise ConfigError("checkpoint: give the drafter folder to calibrate, e.g. checkpoint=runs/dspark/final")
    from runners.common import resolve_drafter_path, writable_folder

    if str(cfg.checkpoint).startswith("builtin:"):  # the fit writes its temperatures.json into the checkpoint
        raise ConfigError(f"checkpoint: {cfg.checkpoint} is the drafter the package ships, which calibrating would "
                          "overwrite; copy its folder and calibrate the copy (checkpoint=COPY)")
    checkpoint = Path(resolve_drafter_path(str(cfg.checkpoint), key="checkpoint"))
    check_options(cfg)
    from runners.schema import check_device_present

    check_device_present(str(cfg.device), "device")

    # Every output's folder before any work: a report it could not write after the fit left the checkpoint with
    # a new temperatures.json and no calibration.json beside it.
    for key, default in (("output_json", checkpoint), ("plot", checkpoint)):
        writable_folder(Path(cfg[key]).parent if cfg.get(key) else default, key)
    dtype = DTYPES[cfg.dtype]
    if cfg.get("traces"):  # the engine already drafted and verified: no data, no replay, no target
        if cfg.get("data"):
            raise ConfigError("data and traces: give one source of blocks to calibrate on, not both")
        dataset = None
        target_cfg = target.cfg if target is not None else ModelConfig.from_dict(
            json.loads((checkpoint / "config.json").read_text())["target"])
        target = None
    else:
        dataset = held_out_data(cfg)
        if target is None:
            from runners.train_drafter import load_target_and_tokenizer

            target, _ = load_target_and_tokenizer(cfg)
        target = target.to(device=cfg.device, dtype=dtype).eval()
        target_cfg = target.cfg
    drafter = DSparkDrafter.load(checkpoint, target_cfg, device=cfg.device, dtype=dtype).eval()
    previous, previous_biases, previous_weights, previous_gap_weights = drafter.calibration_values()  # as shipped
    drafter.set_confidence_temperatures([1.0] * drafter.block_size)  # fit from the raw head (no bias, no weights)
    with torch.no_grad():
        report = calibrate(target, drafter, dataset, checkpoint, cfg, previous=previous,
                           previous_biases=previous_biases, previous_weights=previous_weights,
                           previous_gap_weights=previous_gap_weights)
    return report


@runner_main("calibrate")
def main(cfg: DictConfig) -> None:
    report = run(cfg)
    keys = ("reported_on", "blocks", "split", "method_option", "auc_overall", "ece_before", "ece_after",
            "target_ece_verdict", "temperatures", "biases", "max_prob_weights", "top_gap_weights",
            "greedy_mean_accept_length", "replay_temperature",
            "output_json", "reliability_plot")
    summary = {k: report[k] for k in keys if k in report}
    # the head alone ranks as the calibrated confidence does, except under sts_max_prob / sts_top_gap (a second
    # feature)
    summary["head_auc_overall"] = report.get("head_auc", report)["auc_overall"]
    if "in_sample" in report:
        summary["in_sample_ece_after"] = report["in_sample"]["ece_after"]
    if "ece_after" in report.get("bootstrap", {}):
        b = report["bootstrap"]["ece_after"]
        summary["ece_after_interval"] = [b["low"], b["high"]]
    for score in ("draft_max_prob", "draft_top_gap"):
        if f"{score}_auc" in report:
            summary[f"{score}_auc_overall"] = report[f"{score}_auc"]["auc_overall"]
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
