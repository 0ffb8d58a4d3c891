"""Paged KV cache: the page allocator (torch-free) and the cache tensors.

A request owns a list of pages (its block table). Pages are handed out from a free list
and returned when the request finishes or is preempted. The target and the drafter use
the same block tables: position p of a request lives at the same slot in both caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class OutOfPages(RuntimeError):
    """No free page is left; the scheduler must preempt or queue."""


@dataclass
class BlockManager:
    num_pages: int
    page_size: int
    _free: list[int] = field(default_factory=list)
    _tables: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_pages < 1 or self.page_size < 1:
            raise ValueError(f"BlockManager needs num_pages >= 1 and page_size >= 1, got {self.num_pages}, {self.page_size}")
        self._free = list(range(self.num_pages - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_needed(self, req_id: int, num_tokens: int) -> int:
        have = len(self._tables.get(req_id, ()))
        need = -(-num_tokens // self.page_size)
        return max(0, need - have)

    def can_reserve(self, req_id: int, num_tokens: int) -> bool:
        return self.pages_needed(req_id, num_tokens) <= len(self._free)

    def reserve(self, req_id: int, num_tokens: int) -> None:
        """Make sure the request has slots for positions [0, num_tokens)."""
        n = self.pages_needed(req_id, num_tokens)
        if n > len(self._free):
            raise OutOfPages(f"request {req_id} needs {n} more pages, {len(self._free)} free")
        table = self._tables.setdefault(req_id, [])
        for _ in range(n):
            table.append(self._free.pop())

    def free(self, req_id: int) -> None:
        for p in reversed(self._tables.pop(req_id, [])):
            self._free.append(p)

    def table(self, req_id: int) -> list[int]:
        return self._tables.get(req_id, [])

    def slot(self, req_id: int, position: int) -> int:
        table = self._tables[req_id]
        return table[position // self.page_size] * self.page_size + position % self.page_size

    def capacity(self, req_id: int) -> int:
        return len(self._tables.get(req_id, ())) * self.page_size


class KVCache:
    """K and V tensors for all layers: [num_layers, num_pages, page_size, kv_heads, head_dim]."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_pages, page_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    @property
    def num_pages(self) -> int:
        return int(self.k.shape[1])

    @property
    def page_size(self) -> int:
        return int(self.k.shape[2])

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2
