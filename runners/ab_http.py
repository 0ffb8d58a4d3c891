"""runners.ab's HTTP arms: an arm with ``ab.arms.<arm>.http`` set is a server reached over HTTP.

The runner keeps its block schedule, statistics, report and guards; this module supplies what differs for an
HTTP arm (the server's life cycle and the requests are :mod:`dspark.bench.http`'s):

- :func:`http_endpoints` reads and checks each HTTP arm's settings (``ab.arms.<arm>.http.*``), and
  :func:`check_http_arms` what spans keys: an HTTP arm takes no engine overrides (its engine is its server's),
  the API must suit the workload's prompts, and when every arm is HTTP no engine, model or drafter setting of
  the command line can have an effect.
- :class:`HttpArms` owns the arms' servers for a run: every server is stopped when the run ends, raises or is
  interrupted (SIGTERM outside the timed blocks ends the run with exit status 143 after stopping them).
- :func:`http_guards` are the run's guards when an arm is HTTP: errors; and when arm A runs in this process and
  every served arm returned token ids (with arm A in float32: and runs float32 too; :func:`not_rescored`), the
  guards of two in-process arms over the served arm's token ids (``runners.ab.reference_guards``, arm A's target
  as the reference): lossless identical token for token in float32, the evidence guard in reduced precision (the
  float32 re-scoring of every greedy output, the noise bound from A and A's control run, the rate test), and the
  distribution check of sampled tokens, under the same names and details, each saying where an arm's outputs
  came from. Otherwise losslessness is compared on the API's greedy outputs (token ids when both arms return
  them, else text, said in the message), exact in float32, and outputs that differ with either arm's precision
  reduced or unknown fail unjudged, the message naming the precision and why the re-scoring could not judge;
  the distribution check is then not run (said in its message). did_nothing from the engine counters this
  project's server exports, and explicitly unchecked for a server whose configuration is unknown.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from dspark.bench.guards import (FULL_PRECISION_DTYPES, GuardResult, errors_guard, lossless_guard,
                                 nothing_compared_guard)
from dspark.bench.http.arm import HttpArm
from dspark.bench.http.endpoint import HttpEndpoint
from dspark.bench.http.load import HttpRequest
from dspark.config import ConfigError, EngineConfig

log = logging.getLogger(__name__)
# httpx logs every request at INFO: thousands of lines per block would drown the run's log.
logging.getLogger("httpx").setLevel(logging.WARNING)

ARMS = ("A", "B")
WARMUP_MAX_TOKENS = 64  # as the in-process warm-up: every code path, short outputs


def _python_executable() -> str:
    return sys.executable


# ``${python:}``: the interpreter running runners.ab, for launch commands (conf/ab/http_full_vs_ragged.yaml).
if not OmegaConf.has_resolver("python"):
    OmegaConf.register_new_resolver("python", _python_executable)


# ---- configuration -------------------------------------------------------------------------------
def http_endpoints(cfg: DictConfig) -> dict[str, HttpEndpoint]:
    """{arm: its HttpEndpoint} of the arms with ``ab.arms.<arm>.http`` set; a bad value raises ConfigError naming
    ``ab.arms.<arm>.http.<key>``."""
    out: dict[str, HttpEndpoint] = {}
    for arm in ARMS:
        node = cfg.ab.arms[arm].get("http")
        if node is None:
            continue
        values = OmegaConf.to_container(node, resolve=True, enum_to_str=True)
        if values.get("launch") is not None:
            values["launch"] = tuple(str(a) for a in values["launch"])
        try:
            out[arm] = HttpEndpoint(**values)
        except ConfigError as exc:
            raise ConfigError(f"ab.arms.{arm}.http.{exc}") from None
    return out


def check_http_arms(cfg: DictConfig, endpoints: Mapping[str, HttpEndpoint]) -> None:
    """The checks that span keys (module docstring), before anything starts."""
    for arm, endpoint in endpoints.items():
        engine = OmegaConf.to_container(cfg.ab.arms[arm].engine, resolve=True) or {}
        if engine:
            raise ConfigError(f"ab.arms.{arm}.engine={engine} has no effect: arm {arm} is served over HTTP "
                              f"(ab.arms.{arm}.http), its engine is the server's; set it in the server's launch "
                              f"command (ab.arms.{arm}.http.launch)")
    if len(endpoints) == len(ARMS):
        touched = [o for o in _task_overrides() if o.lstrip("+~").split("=", 1)[0].split(".")[0]
                   in ("engine", "model", "drafter", "spec")]
        if touched:
            raise ConfigError(f"{', '.join(touched)}: no effect, every arm is served over HTTP (ab.arms.*.http) and runs "
                              "its server's engine; put engine settings in the arms' launch commands")
        ports = {}
        for arm, e in endpoints.items():
            if e.root_url in ports:
                raise ConfigError(f"ab.arms.A.http and ab.arms.B.http both reach {e.root_url}: two arms need two servers")
            ports[e.root_url] = arm


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def check_prompt_kinds(endpoints: Mapping[str, HttpEndpoint], prompts) -> None:
    """Chat prompts go to api=chat, text prompts to api=completions; a mismatch is refused by name."""
    for arm, e in endpoints.items():
        for p in prompts:
            if (p.messages is None) == (e.api == "chat"):
                kind = "text prompt" if p.messages is None else "chat prompt"
                other = "completions" if e.api == "chat" else "chat"
                raise ConfigError(f"ab.arms.{arm}.http.api={e.api}: prompt {p.id!r} is a {kind}; set "
                                  f"ab.arms.{arm}.http.api={other} (every prompt of a workload must suit it)")


def http_requests(prompts, params) -> list[HttpRequest]:
    return [HttpRequest.of(p.id, p.messages, p.prompt, sp) for p, sp in zip(prompts, params)]


def warmup_requests(requests: list[HttpRequest], n: int) -> list[HttpRequest]:
    """The first ``n`` requests, outputs capped at :data:`WARMUP_MAX_TOKENS` (ids suffixed ``#warmup``)."""
    import dataclasses

    return [dataclasses.replace(r, request_id=f"{r.request_id}#warmup", max_tokens=min(r.max_tokens, WARMUP_MAX_TOKENS))
            for r in requests[:n]]


# ---- the run's servers ---------------------------------------------------------------------------
class HttpArms:
    """The HTTP arms of one run (``with``: every server stopped at the end, however the run ends). Their warm-up
    requests are given once the workload is known (:meth:`set_warmup`)."""

    def __init__(self, endpoints: Mapping[str, HttpEndpoint], out_dir: Path, concurrency: int):
        self.endpoints = dict(endpoints)
        self.arms = {arm: HttpArm(arm, e, Path(out_dir) / "servers", (), concurrency) for arm, e in endpoints.items()}
        self._previous = None

    def set_warmup(self, requests: list[HttpRequest]) -> None:
        for arm in self.arms.values():
            arm.warmup = list(requests)

    def __contains__(self, arm: str) -> bool:
        return arm in self.arms

    def __getitem__(self, arm: str) -> HttpArm:
        return self.arms[arm]

    def __bool__(self) -> bool:
        return bool(self.arms)

    def __enter__(self) -> "HttpArms":
        if self.arms and threading.current_thread() is threading.main_thread():
            def on_sigterm(signum, frame):
                raise SystemExit(143)

            self._previous = signal.signal(signal.SIGTERM, on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        try:
            for arm in self.arms.values():
                arm.close()
        finally:
            if self._previous is not None:
                signal.signal(signal.SIGTERM, self._previous)
                self._previous = None


def engine_config_of(arm: HttpArm) -> EngineConfig | None:
    """The engine configuration the arm's server reported (this project's server), else None."""
    from runners.schema import to_engine_config

    if arm.server_info is None:
        return None
    return to_engine_config(arm.server_info["engine"], local=False)  # the server's device, not this machine's


def served_cost_table(arm: HttpArm) -> dict[str, Any] | None:
    """The cost table the arm's server reported using (runners.serve's engine.cost_table), described as the
    in-process arms' are when this process can read it; None when the server reports none."""
    from dspark.cost_table import CostTable, CostTableError
    from dspark.profiler import describe_table

    path = (arm.server_info or {}).get("engine", {}).get("cost_table")
    if path is None:
        return None
    try:
        table = CostTable.load(path)
    except (OSError, CostTableError):  # on the server's node only: described by its path
        table = None
    return describe_table(path, table, "the server's (its /dspark/engine)")


def describe(arm: HttpArm, label: str) -> dict[str, Any]:
    out: dict[str, Any] = {"label": label, "http": arm.describe()}
    if arm.server_info is not None:
        out["engine"] = arm.server_info["engine"]
        if "models" in arm.server_info:  # runners.serve reports them; another server need not
            out["models"] = arm.server_info["models"]
    return out


# ---- guards --------------------------------------------------------------------------------------
def api_lossless_guard(name: str, ids: Mapping[str, Mapping[str, list[int] | None]],
                       texts: Mapping[str, Mapping[str, str]], dtypes: Mapping[str, str | None], *,
                       not_rescored: str) -> GuardResult:
    """The arms' greedy outputs of one run compared as the API returned them: token ids when every output of
    both arms has them, else text. Identical outputs pass. A difference fails; in float32 on both arms it is an
    error (the in-process guard's rule), otherwise it is reported unjudged, naming each arm's precision and why
    the float32 re-scoring could not judge it (``not_rescored``: :func:`not_rescored`)."""
    no_ids = [arm for arm in ARMS if any(v is None for v in ids[arm].values())]
    if no_ids:
        outs = {arm: dict(texts[arm]) for arm in ARMS}
        what = f"text: arm {' and '.join(no_ids)} returned no token ids"
    else:
        outs = {arm: {rid: list(v) for rid, v in ids[arm].items()} for arm in ARMS}
        what = "token ids"
    g = lossless_guard(outs["A"], outs["B"], dtype="float32")
    g.name = name
    exact = all(dtypes[arm] in FULL_PRECISION_DTYPES for arm in ARMS)
    precision = ", ".join(f"{arm} {dtypes[arm] or 'unknown'}" for arm in ARMS)
    g.message = g.message.replace("identical (float32)", f"identical ({what}; precision {precision})", 1)
    g.details.update({"compared": what, "dtypes": dict(dtypes), "method": "exact" if exact else "exact, unjudged"})
    if not exact:
        g.details["not_rescored"] = not_rescored
    if not g.passed and not exact:
        g.message += (f"; an arm's precision is reduced or unknown, and telling a rounding flip from an error needs "
                      f"the float32 re-scoring with arm A's target in this process, which cannot judge this run "
                      f"({not_rescored}): the differences are not judged, so the guard fails (ab.fail_on_guard=false "
                      "keeps the results)")
    return g


def not_rescored(outputs, replica_outputs, dtypes: Mapping[str, str | None], http_arms: "HttpArms",
                 a_in_process: bool) -> str | None:
    """None when the guards that re-score with arm A's target in this process (runners.ab.reference_guards) can
    judge this run as they judge two in-process arms, else why not: arm A must run in this process (the
    reference is its target, the control run is A again), every output of a served arm that the guards read
    (its blocks' and greedy replicas') must be token ids, and a float32 arm A measures no rounding noise, so it
    can judge a served arm in float32 only."""
    if not a_in_process:
        return ("arm A is served over HTTP, and the re-scoring needs arm A in this process: its target is the "
                "reference, and its control run is arm A again")
    no_ids = [arm for arm in http_arms.arms if any(v is None for run in [*outputs[arm].values(),
                                                                         replica_outputs.get(arm, {})]
                                                   for v in run.values())]
    if no_ids:
        return f"arm {' and '.join(no_ids)} returned no token ids"
    unmeasured = [arm for arm in http_arms.arms if dtypes[arm] not in FULL_PRECISION_DTYPES]
    if dtypes["A"] in FULL_PRECISION_DTYPES and unmeasured:
        return (f"arm A runs in float32, so this run measures no rounding noise to judge arm {unmeasured[0]}'s "
                f"precision ({dtypes[unmeasured[0]] or 'unknown'}) by")
    return None


def unchecked_guard(name: str, message: str, details: dict | None = None) -> GuardResult:
    """A check an HTTP arm cannot give: passed, its message and details saying it was not checked."""
    return GuardResult(name, True, f"not checked: {message}", {"state": "unchecked", **(details or {})})


def http_guards(cfg: DictConfig, workload, records, outputs, texts, replica_outputs, replica_texts, block_rows,
                arm_cfgs: Mapping[str, EngineConfig | None], http_arms: HttpArms, did_nothing,
                reference=None) -> list[GuardResult]:
    """The guards of a run with an HTTP arm (module docstring). ``arm_cfgs``: each arm's engine configuration
    (in-process, or reported by its server), None when unknown; ``did_nothing(arm, ecfg, block_rows)``: the
    runner's did_nothing guard of one arm; ``reference()``: the runner's guards that judge the outputs with arm
    A's target in this process, A's control run included (runners.ab.reference_guards), None when arm A is
    served. They judge the run where they can (:func:`not_rescored`); elsewhere the outputs are compared as the
    API returned them."""
    guards: list[GuardResult] = [errors_guard(records)]
    dtypes = {arm: (arm_cfgs[arm].dtype if arm_cfgs.get(arm) is not None else None) for arm in ARMS}
    greedy = workload.sampling().greedy
    why = not_rescored(outputs, replica_outputs, dtypes, http_arms, reference is not None)
    if why is None:
        served = {arm: f"served over HTTP, token ids from its API (precision {dtypes[arm] or 'unknown'})"
                  for arm in http_arms.arms}
        for g in reference():
            if g.name.startswith(("lossless", "distribution")):
                g.details["outputs"] = {arm: served.get(arm, "in process") for arm in ARMS}
            guards.append(g)
    else:
        if greedy:
            for block in sorted(set(outputs["A"]) & set(outputs["B"])):
                guards.append(api_lossless_guard(f"lossless/block{block}", {a: outputs[a][block] for a in ARMS},
                                                 {a: texts[a][block] for a in ARMS}, dtypes, not_rescored=why))
        if replica_outputs:
            guards.append(api_lossless_guard("lossless/greedy_replicas", replica_outputs, replica_texts, dtypes,
                                             not_rescored=why))
        if not greedy and not replica_outputs:
            guards.append(nothing_compared_guard())
        if not greedy:
            for arm in ARMS:
                guards.append(unchecked_guard(f"distribution[{arm}]", "the sampled tokens' distribution check "
                                              f"re-scores them with arm A's target in this process, which cannot "
                                              f"judge this run ({why}); it is run for neither arm (the greedy "
                                              "replicas are still compared)", {"not_rescored": why}))
    for arm in ARMS:
        ecfg = arm_cfgs.get(arm)
        if arm in http_arms and ecfg is None:
            e = http_arms[arm].endpoint
            counters = {k.split("/", 1)[1]: v for r in block_rows if r["arm"] == arm for k, v in r.items()
                        if k.startswith("counter/spec_decode/")}
            guards.append(unchecked_guard(
                f"did_nothing[{arm}]", f"arm {arm}'s server ({e.metrics} metrics) does not report its engine "
                "configuration, so what it was configured to run is unknown to the runner; its speculative-decoding "
                f"counters over the blocks: {counters or 'none exported'}", {"counters": counters}))
            continue
        g = did_nothing(arm, ecfg, block_rows)
        if arm in http_arms and http_arms[arm].endpoint.metrics_url is None and not g.passed:
            g.message += (f" (arm {arm} is served over HTTP without ab.arms.{arm}.http.metrics_url: its engine counters "
                          "are unknown; set it to the server's /metrics)")
        guards.append(g)
    return guards
