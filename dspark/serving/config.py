"""The server's settings (``python -m runners.serve``: conf/serve.yaml)."""

from __future__ import annotations

from dataclasses import dataclass

from dspark.config import ConfigError

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    served_model_name: str = "dspark"  # the `model` requests name (and /v1/models lists)
    log_level: str = "info"
    # On SIGINT/SIGTERM: new requests get 503, requests in flight get this long to finish, then they
    # are aborted and the engine loop (its thread or its process) stops.
    graceful_shutdown_s: float = 30.0
    # runners.serve: build and run the engine in a process of its own (engine_process.EngineProcess), which never
    # shares a GIL with the HTTP side; False: in a thread of the server's process (engine_loop.EngineLoop).
    # create_app serves whichever it is given.
    engine_process: bool = True
    # Render and tokenize requests' prompts in this many worker processes (dspark.serving.prompt_workers), off the
    # event loop that streams every response; 0: on the event loop.
    prompt_workers: int = 0
    # runners.serve: this many HTTP front-end processes (API servers), each with its own event loop on the one
    # listening socket, over one engine process (dspark.serving.api_servers), so that parsing, templating,
    # tokenizing and streaming are spread over processes instead of one event loop; 1: the server's own process.
    # Each has its own prompt_workers; /metrics (from any of them) counts every one's finished requests.
    api_servers: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host: give an address to listen on, e.g. host=127.0.0.1, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port: must be an integer from 0 (any free port) to 65535, got {self.port!r}")
        if not isinstance(self.served_model_name, str) or not self.served_model_name:
            raise ConfigError(f"served_model_name: must be a non-empty name, got {self.served_model_name!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level: {self.log_level!r} is not one of {list(LOG_LEVELS)}")
        if not self.graceful_shutdown_s >= 0:
            raise ConfigError(f"graceful_shutdown_s: must be >= 0 seconds, got {self.graceful_shutdown_s!r}")
        if not isinstance(self.engine_process, bool):
            raise ConfigError(f"engine_process: must be true (the engine in a process of its own) or false (in a "
                              f"thread of the server's process), got {self.engine_process!r}")
        if isinstance(self.prompt_workers, bool) or not isinstance(self.prompt_workers, int) or self.prompt_workers < 0:
            raise ConfigError(f"prompt_workers: must be an integer >= 0 (0: on the event loop), got "
                              f"{self.prompt_workers!r}")
        if isinstance(self.api_servers, bool) or not isinstance(self.api_servers, int) or self.api_servers < 1:
            raise ConfigError(f"api_servers: must be an integer >= 1 (1: HTTP served by the server's own process), "
                              f"got {self.api_servers!r}")
        if self.api_servers > 1 and not self.engine_process:
            raise ConfigError(f"api_servers={self.api_servers} needs engine_process=true: several API server "
                              f"processes share one engine in a process of its own (engine_process=false runs it "
                              f"in a thread of the one server process)")
