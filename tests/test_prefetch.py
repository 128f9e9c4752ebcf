"""Reading batches ahead: same batches, checkpoint position of the consumed batches, errors
surface in the training thread, the reader thread stops."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from heptstudy.config import load_config
from heptstudy.data.batching import BatchLoader
from heptstudy.data.prefetch import PrefetchingLoader
from heptstudy.errors import DataError


@pytest.fixture
def config(tiny_data_dir):
    return load_config(overrides=[f"data.data_dir={tiny_data_dir}", "data.pad_to_multiple=32"])


def _wait_until(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for the reader thread"
        time.sleep(0.01)


def _threads_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        same = torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
        assert same, k


def test_same_batches_and_position_of_consumed_batches(config):
    plain = BatchLoader(config, per_device_batch=2)
    ahead = BatchLoader(config, per_device_batch=2)
    with PrefetchingLoader(ahead, depth=3) as pf:
        for _ in range(2):
            _same(next(pf), next(plain))
        # the reader has gone past the consumed batches ...
        s = ahead.sampler  # events read: 2 per batch
        _wait_until(lambda: s.epoch * len(s) + s.position >= (2 + 3) * 2)
        # ... but the saved position is that of the two batches handed out
        assert pf.state_dict() == plain.state_dict()
        resumed = BatchLoader(config, per_device_batch=2)
        resumed.load_state_dict(pf.state_dict())
        _same(next(pf), next(resumed))


def test_depth_zero_reads_in_the_callers_thread(config):
    plain = BatchLoader(config, per_device_batch=2)
    loader = BatchLoader(config, per_device_batch=2)
    readers = []

    class Recording:  # the loader, noting which thread reads
        def __next__(self):
            readers.append(threading.current_thread())
            return next(loader)

        def state_dict(self):
            return loader.state_dict()

    with PrefetchingLoader(Recording(), depth=0) as pf:
        _same(next(pf), next(plain))
        assert readers == [threading.current_thread()]
        assert loader.sampler.position == 2  # one batch read
        assert pf.state_dict() == plain.state_dict()


class _FailsAt:
    def __init__(self, n):
        self.n, self.served = n, 0

    def __next__(self):
        self.served += 1
        if self.served == self.n:
            raise DataError(f"event {self.served} is broken; regenerate the data set")
        return self.served

    def state_dict(self):
        return {"served": self.served}


def test_reader_error_reaches_the_consumer_with_its_message():
    before = set(threading.enumerate())
    pf = PrefetchingLoader(_FailsAt(3), depth=4)
    assert [next(pf), next(pf)] == [1, 2]
    with pytest.raises(DataError, match="event 3 is broken; regenerate"):
        next(pf)
    assert _threads_started_since(before) == []  # the reader has stopped
    assert pf.state_dict() == {"served": 2}
    with pytest.raises(RuntimeError, match="closed"):
        next(pf)


class _Endless:
    def __init__(self):
        self.served = 0

    def __next__(self):
        self.served += 1
        return self.served

    def state_dict(self):
        return {"served": self.served}


def test_close_stops_a_reader_blocked_on_a_full_queue():
    before = set(threading.enumerate())
    source = _Endless()
    pf = PrefetchingLoader(source, depth=2)
    _wait_until(lambda: source.served >= 3)  # two queued, a third waiting for room
    assert len(_threads_started_since(before)) == 1  # the reader
    t0 = time.monotonic()
    pf.close()
    assert _threads_started_since(before) == []
    assert time.monotonic() - t0 < 5.0
    assert source.served == 3
