"""An HTTP arm's responses as the A/B's per-request records (:class:`dspark.bench.metrics.RequestRecord`), the same
type ``runners.ab.to_records`` makes of an in-process arm's outputs, so that block metrics, statistics, reports
and guards read both alike.

- ``arrival_s`` is when the load generator sent the request, ``scheduled_arrival_s`` when it was due; TTFT is
  measured to the first chunk that carried text or token ids, and each such chunk is one entry of
  ``chunk_times_s`` (the ITL gaps). This project's server streams one chunk per engine step while it keeps up
  (the in-process arm's chunks) and merges the tokens of several steps into one chunk when it lags;
  ``chunk_tokens`` holds each chunk's token count.
- ``output_token_ids`` are the server's token ids when it returned them; otherwise they stay empty and
  ``output_token_count`` holds its ``usage.completion_tokens``.
- ``prompt_tokens`` is ``usage.prompt_tokens`` (or the returned prompt ids' count); None when the server
  reported neither.
- The per-step acceptance (accept and verify lengths, per-position counts) is the server's per-request
  ``acceptance`` field when it returns one (this project's server); otherwise it stays empty, and the block's
  acceptance comes from the Prometheus counters (:mod:`dspark.bench.http.prometheus`).
"""

from __future__ import annotations

from typing import Iterable

from dspark.bench.http.load import HttpResult
from dspark.bench.metrics import RequestRecord


def to_request_record(result: HttpResult, arm: str, block: int) -> RequestRecord:
    ids = list(result.token_ids) if result.token_ids is not None else []
    count = None
    if result.token_ids is None:
        count = int(result.completion_tokens) if result.completion_tokens is not None else None
        if count is None and result.error is None:
            raise ValueError(f"request {result.request_id!r}: the server returned neither token ids nor "
                             "usage.completion_tokens, so the output's length is unknown")
    acceptance = result.acceptance or {}
    return RequestRecord(
        request_id=result.request_id, arm=arm, block=block, prompt_tokens=result.prompt_tokens,
        output_token_ids=ids, arrival_s=result.sent_s,
        first_token_s=result.first_token_s if result.error is None else None,
        finish_s=result.finish_s if result.error is None else None,
        chunk_times_s=list(result.chunk_times_s), chunk_tokens=list(result.chunk_tokens),
        accept_lengths=list(acceptance.get("accept_lengths") or []),
        verify_lengths=list(acceptance.get("verify_lengths") or []),
        per_position_accepts=list(acceptance.get("per_position_accepted") or []),
        per_position_reached=list(acceptance.get("per_position_reached") or []), error=result.error,
        finish_reason=result.finish_reason if result.error is None else "error",
        scheduled_arrival_s=result.scheduled_s, output_token_count=count)


def has_acceptance(results: Iterable[HttpResult]) -> bool:
    """Whether the server returned per-request acceptance (accept lengths) for any of ``results``."""
    return any(r.acceptance and r.acceptance.get("accept_lengths") for r in results)
