"""Serve the engine over an OpenAI-compatible HTTP API.

    python -m runners.serve host=127.0.0.1 port=8000
    python -m runners.serve spec=off port=8001
    python -m runners.serve engine=h200_graphs host=0.0.0.0

Endpoints: /v1/chat/completions and /v1/completions (streamed or not), /v1/models, /health, /metrics
(Prometheus). Every client's requests are batched continuously on the one engine (dspark.serving).
The settings and the port are checked before the model loads; SIGINT/SIGTERM shut down gracefully.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig

from runners.common import build_engine
from runners.hydra_main import runner_main
from runners.schema import to_server_config

log = logging.getLogger(__name__)

# Sampling settings whose CUDA graphs are captured before serving: greedy, plain temperature, top-p,
# top-k and both (a step's graphs depend on which of these its batch needs).
CAPTURED_SAMPLING = ({}, {"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.9}, {"temperature": 1.0, "top_k": 50},
                     {"temperature": 1.0, "top_p": 0.9, "top_k": 50})


def capture_graphs(engine) -> int:
    """Capture every graph requests may replay before the first request arrives (CUDA graphs only)."""
    from dspark.config import SamplingParams

    if not engine.cfg.cuda_graphs:
        return 0
    return sum(engine.capture_graphs([SamplingParams(**kw)]) for kw in CAPTURED_SAMPLING)


def run(cfg: DictConfig, engine: Any = None) -> None:
    """Serve until SIGINT/SIGTERM. ``engine``: an engine to serve instead of building the configured one."""
    from dspark.serving.app import create_app
    from dspark.serving.server import bind_socket, serve

    config = to_server_config(cfg)
    sock = bind_socket(config)  # a port in use is refused before the model loads
    try:
        if engine is None:
            engine = build_engine(cfg)
        graphs = capture_graphs(engine)
        if graphs:
            log.info("captured %d CUDA graphs before serving", graphs)
        app = create_app(engine, config)
        host, port = sock.getsockname()[:2]
        log.info("serving %s at http://%s:%d/v1", config.served_model_name, host, port)
        serve(app, config, sock)
    finally:
        sock.close()


@runner_main("serve")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
