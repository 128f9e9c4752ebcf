"""Stand-ins for the data-dependent parts of a training step, for steps run on fake tensors.

A step on fake tensors (``FakeTensorMode``: shapes and dtypes, no values) cannot copy to the host
(the Hungarian matching), take a data-dependent shape (boolean indexing) or run a kernel that
fake tensors do not implement. :func:`heptstudy.estimate.fake_step.estimate_step` therefore installs a
:class:`StandIns` with :func:`using`, and the few places that would fail ask :func:`active` for
their substitute. Outside :func:`using` nothing is installed and every model and loss runs as
written.

The installed stand-ins are a module global, not a context variable, on purpose: under
activation checkpointing the backbone's forward is replayed inside backward, which the autograd
engine may run on another thread, and the replay must see the same substitutes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StandIns:
    """What a fake-tensor step uses instead of the real thing (``None``: the real thing).

    * ``targets``: the loss's per-event targets, built from the real batch beforehand.
    * ``match(outputs, targets, loss_cfg, prefix)``: the set matching, without a host copy.
    * ``type_encoding(encoder, raw, inputs)``: :class:`heptstudy.model.encoding.TypeEncoder`'s
      forward without a data-dependent shape.
    * ``flex(q, k, v, block_mask)``: the fused attention kernel, as ``(out, lse)``.
    """

    targets: list[Any] | None = None
    match: Callable[..., Any] | None = None
    type_encoding: Callable[..., Any] | None = None
    flex: Callable[..., Any] | None = None


_ACTIVE: StandIns | None = None


def active() -> StandIns | None:
    """The installed stand-ins, or ``None`` (a real step)."""
    return _ACTIVE


@contextlib.contextmanager
def using(stand_ins: StandIns) -> Iterator[StandIns]:
    """Install ``stand_ins`` for the duration of the block (not re-entrant: one fake step at a
    time in a process)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("stand-ins are already installed: fake-tensor steps do not nest")
    _ACTIVE = stand_ins
    try:
        yield stand_ins
    finally:
        _ACTIVE = None


# -------------------------------------------------------------------------- failing writes
# A full disk or an exhausted quota cannot be made on demand in a test; this seam makes every
# write of heptstudy.atomic (reports, checkpoints, predictions, data sets, figures) fail the
# way the disk would, with the OSError it would raise. Nothing installs it outside tests.

_WRITE_FAULT: tuple[OSError, Callable[[str], bool]] | None = None


def write_fault(path: str) -> OSError | None:
    """The error a write to ``path`` is to fail with, or None (a real write)."""
    if _WRITE_FAULT is None:
        return None
    error, applies = _WRITE_FAULT
    return error if applies(str(path)) else None


@contextlib.contextmanager
def failing_writes(
    error: OSError, applies: Callable[[str], bool] = lambda path: True
) -> Iterator[None]:
    """Every atomic write to a path for which ``applies(path)`` holds raises ``error`` (e.g.
    ``OSError(errno.ENOSPC, "No space left on device")``) for the duration of the block."""
    global _WRITE_FAULT
    saved, _WRITE_FAULT = _WRITE_FAULT, (error, applies)
    try:
        yield
    finally:
        _WRITE_FAULT = saved
