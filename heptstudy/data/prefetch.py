"""Reading batches ahead of training in a background thread.

Reading, the neighbourhood features and padding take milliseconds per event
(``scripts/bench_data.py``): between two steps they would leave the accelerator idle. The
``state_dict`` is the position after the last batch *handed out*, not after the last one read
ahead, so a checkpoint taken mid-run resumes on exactly the batch the run would train on next.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

_POLL_S = 0.1  # how often a blocked producer looks whether it has been closed


class PrefetchingLoader:
    """Wraps a loader with ``__next__`` and ``state_dict`` (a positioned batch loader) and yields
    the same batches in the same order; ``depth=0`` reads each batch when it is asked for, in the
    caller's thread.  Close it (or use ``with``) to stop the reader thread."""

    def __init__(self, loader: Any, depth: int) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self.loader = loader
        self._state = loader.state_dict()
        self._closed = threading.Event()
        self._thread = None
        if depth:
            self._ready: queue.Queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(
                target=self._produce, name="batch-prefetch", daemon=True
            )
            self._thread.start()

    def _put(self, item: tuple[Any, Any]) -> bool:
        while not self._closed.is_set():
            try:
                self._ready.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            while not self._closed.is_set():
                batch = next(self.loader)
                if not self._put((batch, self.loader.state_dict())):
                    return
        except BaseException as err:  # handed to the consumer, raised there with its message
            self._put((err, None))

    def __iter__(self) -> PrefetchingLoader:
        return self

    def __next__(self) -> Any:
        if self._closed.is_set():
            raise RuntimeError("this PrefetchingLoader was closed; create a new one")
        if self._thread is None:
            batch = next(self.loader)
            self._state = self.loader.state_dict()
            return batch
        batch, state = self._ready.get()
        if isinstance(batch, BaseException):
            self.close()
            raise batch
        self._state = state
        return batch

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> PrefetchingLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
