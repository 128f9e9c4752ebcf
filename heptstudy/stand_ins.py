"""Stand-ins for what a fake-tensor training step cannot do (copy to the host, take a
data-dependent shape, run an unimplemented kernel): such places ask :func:`active`; the model's
sliced loops go through :func:`repeated` so a fake step may skip repeats of known memory.

A module global, not a context variable: under activation checkpointing the forward is replayed
inside backward, possibly on another thread, and must see the same substitutes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class StandIns:
    """A fake-tensor step's substitutes (``None``: the real thing); ``flex(q, k, v, block_mask)``
    returns ``(out, lse)``, ``repeats(items)`` the iterations of a :func:`repeated` loop run."""

    targets: list[Any] | None = None
    match: Callable[..., Any] | None = None
    type_encoding: Callable[..., Any] | None = None
    flex: Callable[..., Any] | None = None
    repeats: Callable[[list], Iterable] | None = None


_ACTIVE: StandIns | None = None


def active() -> StandIns | None:
    return _ACTIVE


def repeated(items: list[T]) -> Iterable[T]:
    """``items``, the iterations of a loop of equal shapes (the last may be shorter); a fake-tensor
    step may skip repeats whose memory it knows."""
    if _ACTIVE is None or _ACTIVE.repeats is None:
        return items
    return _ACTIVE.repeats(items)


@contextlib.contextmanager
def using(stand_ins: StandIns) -> Iterator[StandIns]:
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("stand-ins are already installed: fake-tensor steps do not nest")
    _ACTIVE = stand_ins
    try:
        yield stand_ins
    finally:
        _ACTIVE = None


# Tests' failing_writes (only) make heptstudy.atomic's writes fail as a full disk would.
_WRITE_FAULT: tuple[OSError, Callable[[str], bool]] | None = None


def write_fault(path: str) -> OSError | None:
    if _WRITE_FAULT is None:
        return None
    error, applies = _WRITE_FAULT
    return error if applies(str(path)) else None
