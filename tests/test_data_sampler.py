"""Interleaved-shard sampler: coverage, interleaving, rank slices, resumable state."""

from __future__ import annotations

import numpy as np
import pytest

from heptstudy.data.sampler import InterleavedShardSampler
from heptstudy.errors import DataError

SIZES = [7, 3, 12, 5]


def _shard_of(i):
    return int(np.searchsorted(np.cumsum(SIZES), i, side="right"))


def test_every_event_once_per_epoch():
    s = InterleavedShardSampler(SIZES, seed=1)
    seen = []
    for epoch in range(3):
        got = s.epoch_indices(epoch).tolist()
        assert sorted(got) == list(range(sum(SIZES)))
        seen.append(got)
    assert seen[0] != seen[1]  # reshuffled each epoch
    assert InterleavedShardSampler(SIZES, seed=1).epoch_indices(0).tolist() == seen[0]


def test_interleaves_shards():
    s = InterleavedShardSampler(SIZES, seed=3)
    order = [_shard_of(i) for i in s.epoch_indices(0)]
    # round r visits every shard that still has events, each exactly once
    pos = 0
    for r in range(max(SIZES)):
        active = {k for k, n in enumerate(SIZES) if n > r}
        chunk = order[pos : pos + len(active)]
        assert set(chunk) == active and len(chunk) == len(active)
        pos += len(active)
    # the shard order within rounds is random, not fixed
    firsts = {tuple(order[:4]) for _ in range(1)}
    orders = {
        tuple(_shard_of(i) for i in InterleavedShardSampler(SIZES, seed=k).take(4))
        for k in range(10)
    }
    assert len(orders) > 1 and firsts
    # within a shard events are shuffled
    shard2 = [i for i in s.epoch_indices(0) if _shard_of(i) == 2]
    assert shard2 != sorted(shard2)


def test_rank_slices_disjoint_and_equal():
    world = 4
    total = sum(SIZES)
    parts = []
    for rank in range(world):
        s = InterleavedShardSampler(SIZES, seed=5, rank=rank, world_size=world)
        parts.append(s.epoch_indices(2).tolist())
    assert all(len(p) == total // world for p in parts)
    flat = [i for p in parts for i in p]
    assert len(set(flat)) == len(flat)
    assert len(flat) == total - total % world


def test_resume_continues_identical_sequence():
    a = InterleavedShardSampler(SIZES, seed=9, rank=1, world_size=2)
    a.take(5)
    state = a.state_dict()
    want = a.take(40)  # crosses epochs
    b = InterleavedShardSampler(SIZES, seed=9, rank=1, world_size=2)
    b.load_state_dict(state)
    assert b.take(40) == want
    c = InterleavedShardSampler(SIZES, seed=9, world_size=3)
    with pytest.raises(DataError, match="world_size"):
        c.load_state_dict(state)


def test_take_spans_epochs_in_order():
    s = InterleavedShardSampler(SIZES, seed=2)
    n = sum(SIZES)
    seq = s.take(2 * n + 3)
    e0, e1, e2 = (
        InterleavedShardSampler(SIZES, seed=2).epoch_indices(e).tolist() for e in range(3)
    )
    assert seq == e0 + e1 + e2[:3]


def test_sequential_mode_and_errors():
    s = InterleavedShardSampler(SIZES, seed=0, mode="sequential")
    assert s.take(sum(SIZES)) == list(range(sum(SIZES)))
    with pytest.raises(DataError, match="rank"):
        InterleavedShardSampler(SIZES, seed=0, rank=2, world_size=2)
