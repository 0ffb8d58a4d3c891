"""An A/B arm served over HTTP: an OpenAI-compatible server, launched by the runner or already running.

Modules: ``endpoint`` (HttpEndpoint: where the server is, how to start it, which metrics it exports),
``launcher`` (ServerProcess: a server command in its own process group, health-checked, always stopped),
``prometheus`` (the speculative-decoding counter names of vLLM, SGLang, TensorRT-LLM, llama.cpp and this
project's server, and their per-block deltas), ``load`` (the streaming load generator: closed loop at a
concurrency or Poisson arrivals at a rate), ``records`` (a response -> the A/B's RequestRecord) and ``arm``
(HttpArm: one arm's server across the blocks of a run). ``runners.ab`` uses them for ``ab.arms.<arm>.http``.
Nothing here imports Hydra.
"""
