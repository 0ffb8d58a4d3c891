"""Where an HTTP arm's server is, how to start it and what it exports: :class:`HttpEndpoint`.

Every value is checked when the endpoint is made; a bad one raises ConfigError starting with its key
(``base_url: ...``), which runners.ab prefixes with ``ab.arms.<arm>.http.``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from dspark.config import ConfigError

API_KINDS = ("chat", "completions")  # /v1/chat/completions (chat messages) | /v1/completions (text prompts)
METRICS_FLAVOURS = ("dspark", "vllm", "sglang", "trtllm", "llamacpp")  # dspark.bench.http.prometheus.FLAVOURS


def _check_url(key: str, url: Any) -> None:
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{key}: give an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1, got {url!r}")


@dataclass(frozen=True)
class HttpEndpoint:
    """One arm's OpenAI-compatible server.

    ``base_url`` is the API's base as OpenAI clients take it (``http://host:port/v1``); requests go to
    ``{base_url}/chat/completions`` or ``{base_url}/completions`` (``api``). ``launch``: the argv of the command
    that starts the server (None: it is already running); it runs in ``cwd`` (None: the runner's working folder)
    with ``env`` added to the runner's environment. ``health_url`` (None: the server's root, ``base_url`` without
    a trailing ``/v1``, + ``/health``) must answer 200 within ``health_timeout_s`` of the launch. Stopping sends
    SIGINT to the server's process group, SIGTERM after ``stop_timeout_s``, SIGKILL after as long again.
    ``metrics_url`` (None: no Prometheus counters) is scraped before and after every block and read with the
    counter names of ``metrics`` (a flavour of :data:`METRICS_FLAVOURS`). ``return_token_ids`` asks for the
    output's token ids (vLLM's and this project's ``return_token_ids`` extension); ``extra_body`` is added to
    every request's body.
    """

    base_url: str
    model: str | None = None  # the `model` requests name; None: the one model /v1/models lists
    api: str = "chat"
    launch: tuple[str, ...] | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    keep_running: bool = False  # launched servers: keep the server up between this arm's blocks
    health_url: str | None = None
    health_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    metrics_url: str | None = None
    metrics: str = "dspark"
    request_timeout_s: float = 600.0
    return_token_ids: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_url("base_url", self.base_url)
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ConfigError(f"model: a non-empty name, or null for the one model the server lists; got {self.model!r}")
        if self.api not in API_KINDS:
            raise ConfigError(f"api: {self.api!r} is not one of {list(API_KINDS)}")
        if self.launch is not None:
            launch = tuple(self.launch)
            if not launch or not all(isinstance(a, str) and a for a in launch):
                raise ConfigError(f"launch: the command's argv as a list of non-empty strings, e.g. [python, -m, "
                                  f"runners.serve, port=8001], or null for a server already running; got {self.launch!r}")
            object.__setattr__(self, "launch", launch)
        elif self.keep_running:
            raise ConfigError("keep_running: true needs a launch command (a server the runner does not start "
                              "keeps running anyway)")
        for key in ("health_url", "metrics_url"):
            if getattr(self, key) is not None:
                _check_url(key, getattr(self, key))
        if self.metrics not in METRICS_FLAVOURS:
            raise ConfigError(f"metrics: {self.metrics!r} is not one of {list(METRICS_FLAVOURS)} (the counter names "
                              "of that server: docs/DESIGN.md, 'HTTP arms')")
        for key in ("health_timeout_s", "stop_timeout_s", "request_timeout_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{key}: must be a number of seconds > 0, got {value!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(self.env).items()):
            raise ConfigError(f"env: environment variables as name: string value, got {dict(self.env)!r}")
        reserved = {"model", "messages", "prompt", "stream", "stream_options"} & set(self.extra_body)
        if reserved:
            raise ConfigError(f"extra_body: {sorted(reserved)} are set by the load generator; leave them out")

    @property
    def root_url(self) -> str:
        """The server's root: ``base_url`` without a trailing ``/v1``."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    @property
    def resolved_health_url(self) -> str:
        return self.health_url or f"{self.root_url}/health"

    @property
    def request_url(self) -> str:
        return f"{self.base_url}/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def describe(self) -> dict[str, Any]:
        """The endpoint as plain JSON values (summary.json, W&B run names)."""
        return {"base_url": self.base_url, "model": self.model, "api": self.api,
                "launch": list(self.launch) if self.launch is not None else None, "keep_running": self.keep_running,
                "metrics_url": self.metrics_url, "metrics": self.metrics, "return_token_ids": self.return_token_ids}
