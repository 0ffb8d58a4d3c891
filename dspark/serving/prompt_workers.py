"""Requests' prompts rendered (chat template) and tokenized off the server's event loop, in worker processes.

The server's event loop is one Python thread that streams every response; under a deep closed loop it is the
served path's limit, and each admitted request's chat template and tokenization (a few hundred microseconds for a
chat prompt, holding the interpreter lock, so a worker thread buys no parallelism) took a large share of it.
With ``prompt_workers=N`` (N >= 1) they run in N processes of their own (``spawn``; each holds a copy of the
tokenizer, handed over when the pool starts), and the event loop only awaits the ids; with 0 they run on the event
loop. Both give the ids ``Engine.add_request`` would give (the same tokenizer's ``encode_chat`` and ``encode``);
a template that refuses the messages (``TokenizerError``, jinja2's ``TemplateError``, a template's
``raise_exception``) raises :class:`PromptRefused` with its message either way (a worker sends the message back,
not the exception, which need not survive pickling).

    workers = PromptWorkers(tokenizer, 2)
    ids = await workers.chat_ids([{"role": "user", "content": "hi"}])
    workers.close()
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Mapping, Sequence

from jinja2 import TemplateError

from dspark.models.tokenizer import TokenizerError

# The tokenizer of a worker process (set once by the pool's initializer; each worker process holds one).
_worker_tokenizer: Any = None


def _init_worker(tokenizer) -> None:
    # A Ctrl-C or a signal to the process group reaches the server, whose drain decides when the pool stops (a
    # worker ends when the pool shuts down, or when the server's process goes away and its queue closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


class PromptRefused(ValueError):
    """The chat template refused the messages (its message says why)."""


def _encode_chat(tokenizer, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int] | None, str | None]:
    """(ids, None), or (None, why the template refused the messages)."""
    try:
        return tokenizer.encode_chat(messages), None
    except (TokenizerError, TemplateError) as e:
        return None, str(e)


def _chat_ids(messages: Sequence[Mapping[str, Any]]) -> tuple[list[int] | None, str | None]:
    return _encode_chat(_worker_tokenizer, messages)


def _text_ids(prompt: str) -> list[int]:
    return _worker_tokenizer.encode(prompt)


class PromptWorkers:
    """Chat templating and tokenization for the server, in ``workers`` processes (0: on the caller's thread);
    ``workers`` is ServerConfig.prompt_workers, checked there."""

    def __init__(self, tokenizer, workers: int):
        self.tokenizer = tokenizer
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        if workers:
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(tokenizer,))

    async def start(self) -> None:
        """Start every worker now (each loads its copy of the tokenizer), so that no request waits for one."""
        if self._pool is not None:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self._pool, _text_ids, "") for _ in range(self.workers)))

    async def chat_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The prompt ids of chat ``messages``; PromptRefused when the chat template refuses them."""
        if self._pool is None:
            ids, refused = _encode_chat(self.tokenizer, messages)
        else:
            ids, refused = await asyncio.get_running_loop().run_in_executor(self._pool, _chat_ids, list(messages))
        if refused is not None:
            raise PromptRefused(refused)
        return ids

    async def text_ids(self, prompt: str) -> list[int]:
        if self._pool is None:
            return self.tokenizer.encode(prompt)
        return await asyncio.get_running_loop().run_in_executor(self._pool, _text_ids, prompt)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
