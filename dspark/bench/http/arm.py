"""One HTTP arm across an A/B run: :class:`HttpArm`.

Before each of the arm's blocks :meth:`HttpArm.open` makes sure its server serves: a launched server is started
(its log in ``<log_dir>/<arm>-<n>.log``) and health-checked; after every launch, and before the first block of a
server the runner did not start, the arm's warm-up requests run untimed, and the served model's name is
resolved (``/v1/models``) and, for this project's server, its engine configuration read (``/dspark/engine``).
:meth:`HttpArm.run_block` scrapes the metrics, sends the block's requests (:mod:`dspark.bench.http.load`),
scrapes again and returns the records with the block's counters; :meth:`HttpArm.after_block` stops a launched
server unless ``keep_running`` (so two servers of an A/B never share the node), and :meth:`HttpArm.close` stops
whatever still runs. A server that dies within a block fails it with the tail of its log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import httpx

from dspark.bench.http.endpoint import HttpEndpoint
from dspark.bench.http.launcher import LaunchError, ServerProcess
from dspark.bench.http.load import HttpRequest, HttpResult, LoadResult, run_load
from dspark.bench.http.prometheus import (FLAVOURS, MetricsError, Samples, dspark_engine_counters, scrape,
                                          spec_decode_delta, timings_acceptance)
from dspark.bench.http.records import has_acceptance, to_request_record
from dspark.bench.metrics import RequestRecord

log = logging.getLogger(__name__)


class HttpArmError(RuntimeError):
    """An HTTP arm could not serve: its server failed to start or died, its warm-up failed, its metrics broke."""


@dataclass
class BlockRun:
    """One arm-block over HTTP."""

    results: list[HttpResult]
    records: list[RequestRecord]
    wall_s: float
    counters: dict[str, float]  # under Engine.counters()'s keys (dspark) and spec_decode/* (every flavour)
    # The block's acceptance pooled from the counters (or llama.cpp's response timings) when the responses did
    # not carry it per request; {} otherwise. Keys as aggregate_block's (accept_length, accept_rate, ...).
    acceptance: dict[str, Any] = field(default_factory=dict)
    acceptance_source: str = "none"  # responses | prometheus | response timings | none


class HttpArm:
    """The arm ``name`` served at ``endpoint``; ``warmup`` runs untimed after every launch."""

    def __init__(self, name: str, endpoint: HttpEndpoint, log_dir: str | Path, warmup: Sequence[HttpRequest] = (),
                 warmup_concurrency: int = 1):
        self.name = name
        self.endpoint = endpoint
        self.log_dir = Path(log_dir)
        self.warmup = list(warmup)
        self.warmup_concurrency = max(1, int(warmup_concurrency))
        self.server: ServerProcess | None = None
        self.launches = 0
        self.model: str | None = endpoint.model
        self.server_info: dict | None = None  # /dspark/engine of this project's server
        self._warm = False

    @property
    def label(self) -> str:
        return f"arm {self.name} ({self.endpoint.base_url})"

    # ---- the server's life -------------------------------------------------------------------
    def open(self) -> None:
        """Make sure the server serves and is warm (module docstring)."""
        e = self.endpoint
        if e.launch is not None and not (self.server is not None and self.server.running):
            self.launches += 1
            self.server = ServerProcess(e.launch, self.log_dir / f"{self.name}-{self.launches}.log",
                                        e.resolved_health_url, name=f"arm {self.name}", cwd=e.cwd, env=e.env,
                                        health_timeout_s=e.health_timeout_s, stop_timeout_s=e.stop_timeout_s)
            try:
                self.server.start()
                self.server.wait_healthy()
            except LaunchError as exc:
                raise HttpArmError(str(exc)) from None
            self._warm = False
        elif e.launch is None and not self._warm:
            self._check_health()
        if not self._warm:
            self._resolve_model()
            self._read_server_info()
            self._warm_up()
            self._warm = True

    def after_block(self) -> None:
        """Stop a launched server after the arm's block, unless it is to keep running."""
        if self.server is not None and not self.endpoint.keep_running:
            self.stop()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def close(self) -> None:
        """Stop whatever this arm started (idempotent; after an error or an interrupt too)."""
        self.stop()

    # ---- a block -----------------------------------------------------------------------------
    def run_block(self, requests: Sequence[HttpRequest], block: int, *, mode: str, concurrency: int, rate: float,
                  seed: int, on_finished: Callable[[int], Any] | None = None) -> BlockRun:
        """The timed block: counters before, the requests, counters after (the server already open)."""
        before = self._scrape()
        load = self._load(requests, mode=mode, concurrency=concurrency, rate=rate, seed=seed, on_finished=on_finished)
        after = self._scrape()
        records = [to_request_record(r, self.name, block) for r in load.results]
        counters, acceptance, source = self._block_counters(before, after, load.results)
        return BlockRun(load.results, records, load.wall_s, counters, acceptance, source)

    def run_untimed(self, requests: Sequence[HttpRequest], concurrency: int) -> list[HttpResult]:
        """Requests outside the timed blocks (the greedy replicas), closed loop."""
        return self._load(requests, mode="closed", concurrency=concurrency, rate=0.0, seed=0).results

    def describe(self) -> dict[str, Any]:
        return {**self.endpoint.describe(), "model": self.model, "launches": self.launches,
                "server_logs": str(self.log_dir) if self.launches else None}

    # ---- helpers -----------------------------------------------------------------------------
    def _load(self, requests, **kw) -> LoadResult:
        load = run_load(self.endpoint, self.model, requests, **kw)
        self._check_alive()  # a server that died in the load fails the arm, with its log's tail
        return load

    def _check_alive(self) -> None:
        if self.server is not None:
            try:
                self.server.check_alive()
            except LaunchError as exc:
                self.server = None
                raise HttpArmError(str(exc)) from None

    def _check_health(self) -> None:
        url = self.endpoint.resolved_health_url
        try:
            status = httpx.get(url, timeout=10.0).status_code
        except httpx.HTTPError as exc:
            raise HttpArmError(f"{self.label}: nothing answers at {url} ({type(exc).__name__}: {exc}); start the "
                               "server, or give the arm a launch command") from None
        if status != 200:
            raise HttpArmError(f"{self.label}: {url} answered {status}, not 200: the server is not ready")

    def _get_json(self, url: str) -> Any:
        try:
            response = httpx.get(url, timeout=30.0)
        except httpx.HTTPError as exc:
            raise HttpArmError(f"{self.label}: cannot read {url} ({type(exc).__name__}: {exc})") from None
        if response.status_code != 200:
            raise HttpArmError(f"{self.label}: {url} answered {response.status_code}: {response.text[:300]}")
        return response.json()

    def _resolve_model(self) -> None:
        listed = [m.get("id") for m in self._get_json(f"{self.endpoint.base_url}/models").get("data", [])]
        if self.endpoint.model is not None:
            if self.endpoint.model not in listed:
                raise HttpArmError(f"{self.label}: the server serves {listed}, not model={self.endpoint.model!r}")
            return
        if len(listed) != 1:
            raise HttpArmError(f"{self.label}: the server lists {len(listed)} models {listed}; name the one to "
                               "benchmark (ab.arms.<arm>.http.model)")
        if self.model is not None and self.model != listed[0]:
            raise HttpArmError(f"{self.label}: the relaunched server serves {listed[0]!r}, the arm ran {self.model!r}")
        self.model = listed[0]

    def _read_server_info(self) -> None:
        if self.endpoint.metrics != "dspark":
            return
        try:
            info = self._get_json(f"{self.endpoint.root_url}/dspark/engine")
        except HttpArmError as exc:
            raise HttpArmError(f"{exc}; metrics=dspark is for runners.serve, which reports its engine there: for "
                               "another server set ab.arms.<arm>.http.metrics to its kind (vllm, sglang, trtllm, "
                               "llamacpp)") from None
        if self.server_info is not None and info.get("engine") != self.server_info.get("engine"):
            raise HttpArmError(f"{self.label}: the relaunched server runs another engine configuration than the "
                               "arm's earlier blocks; every block of an arm must run the same server")
        self.server_info = info

    def _warm_up(self) -> None:
        if not self.warmup:
            return
        results = self._load(self.warmup, mode="closed", concurrency=self.warmup_concurrency, rate=0.0, seed=0)
        failed = [r for r in results.results if r.error is not None]
        if failed:
            raise HttpArmError(f"{self.label}: {len(failed)} of {len(results.results)} warm-up requests failed, "
                               f"e.g. {failed[0].request_id!r}: {failed[0].error}")
        log.info("%s: warmed up with %d requests (%.1f s)", self.label, len(results.results), results.wall_s)

    def _scrape(self) -> Samples | None:
        if self.endpoint.metrics_url is None:
            return None
        try:
            return scrape(self.endpoint.metrics_url)
        except MetricsError as exc:
            raise HttpArmError(f"{self.label}: {exc}") from None

    def _block_counters(self, before: Samples | None, after: Samples | None,
                        results: list[HttpResult]) -> tuple[dict[str, float], dict[str, Any], str]:
        counters: dict[str, float] = {}
        pooled: dict[str, Any] = {}
        if before is not None and after is not None:
            try:
                delta = spec_decode_delta(before, after, FLAVOURS[self.endpoint.metrics])
                counters.update(delta.counters())
                pooled = delta.acceptance()
                if self.endpoint.metrics == "dspark":
                    counters.update(dspark_engine_counters(before, after))
            except MetricsError as exc:
                raise HttpArmError(f"{self.label}: {exc}") from None
        timed = timings_acceptance(r.timings for r in results)
        if timed is not None:
            counters.update(timed)
        if has_acceptance(results):
            return counters, {}, "responses"
        if pooled:
            return counters, pooled, "prometheus"
        if timed is not None and timed["spec_decode/num_draft_tokens"]:
            rate = timed["spec_decode/num_accepted_tokens"] / timed["spec_decode/num_draft_tokens"]
            return counters, {"accept_rate": rate}, "response timings"
        return counters, {}, "none"
