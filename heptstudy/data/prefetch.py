"""Reading batches ahead of training in a background thread (milliseconds per event that would
leave the accelerator idle). ``state_dict`` is after the last batch *handed out*, not read."""

from __future__ import annotations

import queue
import threading
from typing import Any

_POLL_S = 0.1  # how often a blocked producer looks whether it has been closed


class PrefetchingLoader:
    """The same batches in the same order; ``depth=0`` reads in the caller's thread. Close it."""

    def __init__(self, loader: Any, depth: int) -> None:
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
