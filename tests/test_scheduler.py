"""Continuous batching (dspark/scheduler.py): the prefill-only schedule of the device-resident path."""

from dspark.config import SamplingParams
from dspark.kv_cache import BlockManager
from dspark.request import Request
from dspark.scheduler import Scheduler


def make(n_pages=64, page=4, max_num_seqs=4):
    blocks = BlockManager(n_pages, page)
    return blocks, Scheduler(blocks, max_num_seqs=max_num_seqs, max_num_batched_tokens=64, block_size=3)


def req(i, n):
    return Request(i, list(range(1, n + 1)), SamplingParams(), 3)


def test_schedule_prefills_admits_and_chunks_but_never_schedules_decodes():
    blocks, sched = make()
    decoding = req(0, 5)
    sched.add(decoding)
    sched.schedule_prefills(64)
    decoding.num_computed = decoding.prefill_target  # prefilled: a decoding request now
    for i in (1, 2, 3):
        sched.add(req(i, 30))
    plan = sched.schedule_prefills(40)
    assert plan.decodes == []
    assert [(c.req.req_id, c.start, c.length) for c in plan.prefills] == [(1, 0, 29), (2, 0, 11)]
    assert [r.req_id for r in sched.running] == [0, 1, 2] and [r.req_id for r in sched.waiting] == [3]
    for c in plan.prefills:
        c.req.num_computed = c.start + c.length
    plan = sched.schedule_prefills(40)  # request 2 continues first, then request 3 is admitted
    assert [(c.req.req_id, c.start, c.length) for c in plan.prefills] == [(2, 11, 18), (3, 0, 22)]


def test_schedule_prefills_packs_at_most_max_chunks_and_respects_max_num_seqs():
    blocks, sched = make(max_num_seqs=3)
    for i in range(5):
        sched.add(req(i, 6))
    plan = sched.schedule_prefills(1000, max_chunks=2)
    assert len(plan.prefills) == 2 and len(sched.running) == 2
    for c in plan.prefills:  # the caller ran them
        c.req.num_computed = c.start + c.length
    plan = sched.schedule_prefills(1000, max_chunks=2)
    assert len(plan.prefills) == 1 and len(sched.running) == 3  # max_num_seqs reached
    assert sched.schedule_prefills(0).prefills == []
