"""Serve the engine over an OpenAI-compatible HTTP API.

    python -m runners.serve host=127.0.0.1 port=8000
    python -m runners.serve spec=off port=8001
    python -m runners.serve engine=h200_graphs host=0.0.0.0
    python -m runners.serve engine.verify=ragged find_cost_table=true    # this node's cost table, as runners.ab's
    python -m runners.serve engine_process=false                          # the engine in a thread of the server
    python -m runners.serve api_servers=4                                 # 4 HTTP processes over one engine process

Endpoints: /v1/chat/completions and /v1/completions (streamed or not), /v1/models, /health, /metrics
(Prometheus). Every client's requests are batched continuously on the one engine (dspark.serving), which by
default (``engine_process=true``) is built and run in a process of its own (dspark.serving.engine_process), so
the HTTP side never holds the GIL the engine's steps need; the log names its pid. With ``api_servers=N`` (N > 1)
N processes serve HTTP on the one socket over that engine process (dspark.serving.api_servers): this process
supervises them and forwards SIGINT/SIGTERM.
The settings and the port are checked before the model loads; SIGINT/SIGTERM shut down gracefully.
Test hook: with ``DSPARK_TEST_TINY_MODELS=1`` it serves the tiny random models of tests/tiny.py
(:func:`runners.common.tiny_models`), as runners.ab builds them, so a test can launch it as an A/B's HTTP arm.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runners.common import TINY_MODELS_ENV, build_engine, tiny_models, tiny_models_requested
from runners.hydra_main import runner_main
from runners.schema import to_profile_settings, to_server_config

log = logging.getLogger(__name__)

# Sampling settings whose CUDA graphs are captured before serving: greedy, plain temperature, top-p,
# top-k and both (a step's graphs depend on which of these its batch needs).
CAPTURED_SAMPLING = ({}, {"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.9}, {"temperature": 1.0, "top_k": 50},
                     {"temperature": 1.0, "top_p": 0.9, "top_k": 50})


def check_trimming_has_a_table(cfg: DictConfig) -> None:
    """Refuse, before the model loads, a speculative engine whose planner would trim (engine.verify other than
    full, no forced trim or measured share) but has no cost table to price its options: its planner would decline
    every step, and the server would verify whole blocks while configured to trim."""
    from dspark.config import ConfigError

    e = cfg.engine
    if cfg.get("spec", e.get("spec")) == "off" or e.verify == "full" or e.get("cost_table") is not None:
        return
    if any(e.get(k) is not None for k in ("force_verify_len", "force_budget_frac", "verify_share")):
        return
    raise ConfigError(f"engine.verify={e.verify} trims the verified block where this node's cost table predicts a "
                      "gain, and there is none: set engine.cost_table=PATH, or find_cost_table=true for this node's "
                      "table (profiled first when there is none)")


def capture_graphs(engine) -> int:
    """Capture every graph requests may replay before the first request arrives (CUDA graphs only)."""
    from dspark.config import SamplingParams

    if not engine.cfg.cuda_graphs:
        return 0
    return sum(engine.capture_graphs([SamplingParams(**kw)]) for kw in CAPTURED_SAMPLING)


def run(cfg: DictConfig, engine: Any = None) -> None:
    """Serve until SIGINT/SIGTERM. ``engine``: an engine to serve (in a thread of this process) instead of building
    the configured one, which ``engine_process`` builds and runs in a process of its own (or, false, here)."""
    from dspark.config import ConfigError
    from dspark.serving.app import create_app
    from dspark.serving.server import bind_socket, serve

    config = to_server_config(cfg)
    if cfg.find_cost_table:
        to_profile_settings(cfg.profile)  # checked before the model loads
    elif engine is None:
        check_trimming_has_a_table(cfg)
    if config.api_servers > 1 and engine is not None:
        raise ConfigError(f"api_servers={config.api_servers} serves the configured engine in a process of its own; "
                          f"an engine given in this process is served by this process alone (api_servers=1)")
    sock = bind_socket(config)  # a port in use is refused before the model loads
    process = None  # the engine's own process (engine_process=true)
    try:
        if config.api_servers > 1:
            from dspark.serving.api_servers import serve_api_servers

            serve_api_servers(ServedEngine(for_child(cfg), tiny_models_requested()), config, sock,
                              gc_freeze=cfg.gc_freeze)
            return
        if engine is None and config.engine_process:
            from dspark.serving.engine_process import EngineProcess

            served = process = EngineProcess(ServedEngine(for_child(cfg), tiny_models_requested()))
        else:
            served = prepared(engine, cfg) if engine is not None else ServedEngine(cfg, tiny_models_requested())()
            log.info("engine in a thread of the server's process (%s)",
                     "an engine given" if engine is not None else "engine_process=false")
        app = create_app(served, config)
        if cfg.gc_freeze:
            # Everything alive now lives as long as the server; a full collection that scanned it stalled the event
            # loop by tens of milliseconds under load (process-wide: runners.serve runs one app per process).
            gc.collect()
            gc.freeze()
        host, port = sock.getsockname()[:2]
        log.info("serving %s at http://%s:%d/v1", config.served_model_name, host, port)
        serve(app, config, sock)
    finally:
        sock.close()
        if process is not None:  # stopped by the app's shutdown already, unless the server never started
            process.stop(config.graceful_shutdown_s + 30.0)


@dataclass(frozen=True)
class ServedEngine:
    """The engine a serve config describes, ready to serve (cost table found, CUDA graphs captured): a picklable
    zero-argument factory, called in the process that will run the engine. ``tiny``: the test hook's tiny models
    (DSPARK_TEST_TINY_MODELS=1, set in that process's environment as well)."""

    cfg: DictConfig
    tiny: bool = False

    def __call__(self):
        if self.tiny:
            os.environ[TINY_MODELS_ENV] = "1"
        engine = tiny_engine(self.cfg) if tiny_models_requested() else build_engine(self.cfg)
        return prepared(engine, self.cfg)


def prepared(engine, cfg: DictConfig):
    """``engine`` with this node's cost table when find_cost_table asks for one, its CUDA graphs captured."""
    if cfg.find_cost_table:
        engine = with_cost_table(engine, cfg.paths.cost_tables, to_profile_settings(cfg.profile))
    graphs = capture_graphs(engine)
    if graphs:
        log.info("captured %d CUDA graphs before serving", graphs)
    return engine


def for_child(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` that another process can read: every interpolation resolved here, where Hydra's runtime
    (``${hydra:...}``: the paths group, and any value a user interpolated from it) is set."""
    child = copy.deepcopy(cfg)
    OmegaConf.resolve(child)
    return child


def with_cost_table(engine, root: str, settings):
    """find_cost_table: a trimming engine without engine.cost_table gets this node's table from ``root`` (profiled
    first when there is none: dspark.profiler.find_or_profile, as runners.ab obtains its arms'), rebuilt around the
    same weights. Engines that verify the whole block, or have a table, are returned as they are."""
    import dataclasses

    from dspark.engine import Engine
    from dspark.profiler import find_or_profile

    if engine.cfg.verify == "full" or engine.cfg.cost_table is not None:
        return engine
    obtained = find_or_profile(engine, root, settings, log.info)
    log.info("cost table: %s (%s)", obtained.path, obtained.describe().get("how"))
    return Engine(engine.target, engine.tokenizer, dataclasses.replace(engine.cfg, cost_table=str(obtained.path)),
                  engine.drafter)


def tiny_engine(cfg: DictConfig):
    """Test hook (DSPARK_TEST_TINY_MODELS=1): the configured engine settings over the tiny random models."""
    from dspark.engine import Engine
    from runners.schema import to_engine_config

    log.warning("%s=1: serving the TINY RANDOM test models, not %s (test hook)", TINY_MODELS_ENV, cfg.model.source)
    ecfg = to_engine_config(cfg.engine, spec=cfg.get("spec"))
    target, drafter, tok = tiny_models()
    return Engine(target, tok, ecfg, drafter if ecfg.spec == "dspark" else None)


@runner_main("serve")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
