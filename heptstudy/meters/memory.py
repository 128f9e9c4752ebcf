"""Peak memory of one training step, one interface for every device; the definitions are
:data:`heptstudy.measure.report.PROTOCOL`'s.

The CPU tracker cannot see scratch a kernel frees before returning, non-tensor memory, or tensors
made before the step that were neither handed to ``start_step`` nor used during it. It costs a
Python call per op: take times from untracked steps.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from heptstudy.errors import HeptstudyError
from heptstudy.model.custom_ops import implementation
from heptstudy.units import MIB

#: In stacking order (reports, tables, figures).
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "temporaries",
)

ALLOCATED_DEFINITIONS = {
    "cuda": "torch.cuda.max_memory_allocated after reset_peak_memory_stats (caching allocator)",
    "rocm": "torch.cuda.max_memory_allocated after reset_peak_memory_stats (HIP caching allocator)",
    "cpu": "peak live tensor-storage bytes (TorchDispatchMode storage tracker, "
    "baseline = storages of parameters, buffers, gradients, optimizer state and batch)",
    "tracked": "peak live tensor-storage bytes (TorchDispatchMode storage tracker)",
}
RESERVED_DEFINITIONS = {
    "cuda": "torch.cuda.max_memory_reserved after reset_peak_memory_stats (caching allocator)",
    "rocm": "torch.cuda.max_memory_reserved after reset_peak_memory_stats (HIP caching allocator)",
    "cpu": "peak resident set of the whole process over the step "
    "(VmHWM from /proc/self/status after writing 5 to /proc/self/clear_refs)",
    "tracked": "not measured",
}


class MemoryMeterError(HeptstudyError, RuntimeError):
    """The meter was used out of order (stop without start, start twice, ...)."""


@dataclass
class StepMemory:
    """The memory of one measured step. Bytes; ``None`` where the device cannot say."""

    device_kind: str
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    allocated_definition: str
    reserved_definition: str
    reserved_unavailable_reason: str | None = None
    #: Storage tracker only. ``adopted_bytes``: storages first seen as an op *input*.
    baseline_bytes: int | None = None
    end_allocated_bytes: int | None = None
    adopted_bytes: int | None = None
    ops_seen: int | None = None
    #: ``track_categories`` only.
    categories_at_peak: dict[str, int] | None = None
    categories_at_end: dict[str, int] | None = None
    by_module_at_peak: dict[str, dict[str, int]] | None = None
    timeline: list[tuple[int, int]] | None = None
    marks: list[tuple[int, str]] = field(default_factory=list)

    @property
    def peak_allocated_mib(self) -> float | None:
        return None if self.peak_allocated_bytes is None else self.peak_allocated_bytes / MIB

    @property
    def peak_reserved_mib(self) -> float | None:
        return None if self.peak_reserved_bytes is None else self.peak_reserved_bytes / MIB


@dataclass(slots=True)
class _Entry:
    nbytes: int
    category: str
    owner: str
    ref: weakref.ref


def module_owner(path: str) -> str:
    """The model's top-level child holding ``path``, with a module list's index ("backbone.3",
    "heads"); the model itself is "model"."""
    parts = [p for p in path.split(".") if p] if path else []
    if parts and parts[0] == "module":  # DistributedDataParallel keeps the model here
        parts = parts[1:]
    if not parts:
        return "model"
    return parts[0] + (f".{parts[1]}" if len(parts) > 1 and parts[1].isdigit() else "")


def _storage_of(t: torch.Tensor):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # sparse or other storage-less tensors


class StorageTracker(TorchDispatchMode):
    """Live tensor-storage bytes, their peak and (optionally) their categories. Storages are
    keyed by the identity of their Python object, unique and alive as long as the storage lives."""

    # flex_attention's internals count as a kernel's scratch
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Compiled code stays compiled: a tracked step is the real step, not an unfused fallback."""
        return True

    def __init__(
        self,
        *,
        track_categories: bool = False,
        scratch: Callable[[object, tuple], int] | None = None,
    ):
        super().__init__()
        #: ``scratch(func, args)``: bytes a kernel allocates and frees inside the op.
        self.scratch = scratch
        self.track_categories = track_categories
        self._lock = threading.RLock()
        self._reset()

    def _reset(self) -> None:
        self._live: dict[int, _Entry] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.baseline_bytes = 0
        self.adopted_bytes = 0
        self.scratch_bytes = 0  # the largest transient scratch seen
        self.scratch_ops: dict[str, int] = {}
        self.op_index = 0
        self.category_bytes: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.categories_at_peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.timeline: list[tuple[int, int]] = []
        self.marks: list[tuple[int, str]] = []
        #: by-module breakdown (track_categories only): (owner, category) -> live bytes
        self.owned_bytes: dict[tuple[str, str], int] = {}
        self.owned_at_peak: dict[tuple[str, str], int] = {}
        self._module_names: dict[int, str] = {}
        self._module_stack: list[str] = []
        self._phase = "step"
        self._active = False
        self._hooks: list = []
        self._saved_hooks = None
        self._params: list[torch.Tensor] = []

    def _on_free(self, key: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.live_bytes -= entry.nbytes
                self.category_bytes[entry.category] -= entry.nbytes
                self._own(entry, -entry.nbytes)

    def _register(self, storage, category: str, owner: str = "") -> _Entry:
        """Count ``storage`` if it is new, follow a resize if it is not. Lock held."""
        key = id(storage)
        entry = self._live.get(key)
        nbytes = int(storage.nbytes())
        if entry is None:
            ref = weakref.ref(storage, lambda _r, key=key: self._on_free(key))
            entry = _Entry(nbytes, category, owner or category, ref)
            self._live[key] = entry
            self.live_bytes += nbytes
            self.category_bytes[category] += nbytes
            self._own(entry, nbytes)
        elif entry.nbytes != nbytes:  # resize_ / out= on a storage we already know
            self.live_bytes += nbytes - entry.nbytes
            self.category_bytes[entry.category] += nbytes - entry.nbytes
            self._own(entry, nbytes - entry.nbytes)
            entry.nbytes = nbytes
        return entry

    def _own(self, entry: _Entry, delta: int) -> None:
        if self.track_categories:
            key = (entry.owner, entry.category)
            self.owned_bytes[key] = self.owned_bytes.get(key, 0) + delta

    def _owner(self, t: torch.Tensor) -> str:
        """The running module (recomputation included), else the step's phase."""
        if not self.track_categories:
            return ""
        owner = self._module_stack[-1] if self._module_stack else self._phase
        if t.dtype.is_floating_point or t.dtype.is_complex:
            return owner
        return owner + " [int/bool]"  # index and mask storages: kept for other reasons

    def _update_peak(self) -> None:
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            if self.track_categories:
                self._snapshot()

    def _snapshot(self) -> None:
        self.categories_at_peak = dict(self.category_bytes)
        self.owned_at_peak = {k: v for k, v in self.owned_bytes.items() if v}

    def _transient(self, func, nbytes: int) -> None:
        """A kernel's scratch: live on top of the op's inputs and outputs, freed at its end."""
        if nbytes <= 0:
            return
        name = str(func)
        self.scratch_ops[name] = self.scratch_ops.get(name, 0) + 1
        self.scratch_bytes = max(self.scratch_bytes, nbytes)
        if self.live_bytes + nbytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes + nbytes
            if self.track_categories:
                self.categories_at_peak = dict(self.category_bytes)
                self.categories_at_peak["temporaries"] += nbytes

    def _reclassify(self, t: torch.Tensor, category: str, only_from: tuple[str, ...]) -> None:
        storage = _storage_of(t)
        if storage is None:
            return
        with self._lock:
            entry = self._live.get(id(storage))
            if entry is None:
                entry = self._register(storage, category, self._owner(t))
                self._update_peak()
            elif entry.category in only_from and entry.category != category:
                self.category_bytes[entry.category] -= entry.nbytes
                self.category_bytes[category] += entry.nbytes
                self._own(entry, -entry.nbytes)
                entry.category = category
                if category == "gradients":  # a parameter's gradient, whoever made it
                    entry.owner = category
                self._own(entry, entry.nbytes)
                if self.track_categories and self.live_bytes == self.peak_bytes:
                    # still at the peak (e.g. the op that reached it made an output now saved)
                    self._snapshot()

    def add_baseline(self, tensors: Iterable[torch.Tensor | None], category: str) -> None:
        """Count storages alive at the start (skipping ones already counted)."""
        with self._lock:
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    storage = _storage_of(t)
                    if storage is not None and id(storage) not in self._live:
                        self._register(storage, category)
            self.baseline_bytes = self.live_bytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self._snapshot()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inside = implementation(func)
        if inside is not None:  # heptstudy's own op: its ATen ops are tracked one by one
            with self:
                return inside(*args, **kwargs)
        live = self._live
        for t in iter_tensors((args, kwargs)):
            storage = _storage_of(t)
            if storage is not None and id(storage) not in live:
                self._adopt(storage, t)
        out = func(*args, **kwargs)
        with self._lock:
            for t in iter_tensors(out):
                storage = _storage_of(t)
                if storage is not None:
                    self._register(storage, "temporaries", self._owner(t))
            self.op_index += 1
            self._update_peak()
            if self.scratch is not None:
                self._transient(func, self.scratch(func, args))
            if self.track_categories:
                self.timeline.append((self.op_index, self.live_bytes))
        return out

    def _adopt(self, storage, t: torch.Tensor) -> None:
        """Count an unseen input: made before the step or outside the dispatcher."""
        with self._lock:
            before = self.live_bytes
            self._register(storage, "temporaries", self._owner(t))
            self.adopted_bytes += self.live_bytes - before

    def _pack(self, t: torch.Tensor):
        self._reclassify(t, "activations", only_from=("temporaries",))
        # detach: no reference cycle through the output's own grad_fn; same storage.
        return t.detach()

    @staticmethod
    def _unpack(t: torch.Tensor):
        return t

    def begin(
        self,
        *,
        baseline_tensors: Iterable[torch.Tensor | None] = (),
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        # the meter refuses a second start_step and a stop_step without one (MemoryMeterError)
        self._reset()
        if model is not None:
            params = list(model.parameters())
            self.add_baseline(params, "parameters")
            self.add_baseline(model.buffers(), "parameters")
            self.add_baseline((p.grad for p in params), "gradients")
        if optimizer is not None:
            state = [v for s in optimizer.state.values() for v in s.values()]
            self.add_baseline(state, "optimizer_state")
            for group in optimizer.param_groups:
                self.add_baseline(group["params"], "parameters")
                self.add_baseline((p.grad for p in group["params"]), "gradients")
        self.add_baseline(_flatten_tensors(baseline_tensors), "inputs")
        self._params = list(model.parameters()) if model is not None else []
        if optimizer is not None:
            self._params += [p for g in optimizer.param_groups for p in g["params"]]
        if self.track_categories:
            seen: set[int] = set()
            for p in self._params:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook))
            self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._saved_hooks.__enter__()
            if model is not None:
                self._follow_modules(model)
        self._active = True
        self.__enter__()

    def _grad_hook(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self._reclassify(p.grad, "gradients", only_from=("temporaries", "activations"))

    def _follow_modules(self, model: torch.nn.Module) -> None:
        """Keep the running module on a stack (also during a checkpoint's recomputation)."""
        self._module_names = {id(m): module_owner(path) for path, m in model.named_modules()}
        self._module_stack = []
        hooks = torch.nn.modules.module
        self._hooks.append(hooks.register_module_forward_pre_hook(self._enter_module))
        # always_call: a checkpoint's recomputation stops early by raising inside the module
        self._hooks.append(hooks.register_module_forward_hook(self._leave_module, always_call=True))

    def _enter_module(self, module, _args) -> None:
        name = self._module_names.get(id(module))
        if name is not None:
            self._module_stack.append(name)

    def _leave_module(self, module, _args, _output) -> None:
        if id(module) in self._module_names and self._module_stack:
            self._module_stack.pop()

    def by_module_at_peak(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (owner, category), nbytes in sorted(self.owned_at_peak.items()):
            out.setdefault(owner, {})[category] = nbytes
        return out

    def end(self) -> None:
        self.__exit__(None, None, None)
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._params = []
        self._active = False

    def release(self) -> None:
        """Forget every storage (drops the weak references; no callbacks after this)."""
        with self._lock:
            self._live = {}

    def mark(self, label: str) -> None:
        self.marks.append((self.op_index, label))
        self._phase = label


def iter_tensors(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            if isinstance(item, torch.Tensor):
                yield item
            elif isinstance(item, (list, tuple, dict)):
                yield from iter_tensors(item)
    elif isinstance(obj, dict):
        yield from iter_tensors(list(obj.values()))


def _flatten_tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    elif not isinstance(obj, (list, tuple)):
        obj = list(obj)
    return [x for x in tree_flatten(obj)[0] if isinstance(x, torch.Tensor)]


_CLEAR_REFS = "/proc/self/clear_refs"
_STATUS = "/proc/self/status"


class TrackedMemoryMeter:
    """Measure the peak memory of a step (``start_step``, then ``stop_step``) with the storage
    tracker only: for fake devices, and the base of the CPU and CUDA meters."""

    device_kind = "tracked"
    #: a seam: meters.allocation_trace's meter records the allocation order too
    tracker_class = StorageTracker

    def __init__(self, device, *, track_categories=False, scratch=None):
        self.device = torch.device(device)
        self.track_categories = track_categories
        self.scratch = scratch  # see StorageTracker
        self.tracker: StorageTracker | None = None

    def mark(self, label: str) -> None:
        if self.tracker is not None:
            self.tracker.mark(label)

    def _result(self, allocated, reserved, reason=None, **fields) -> StepMemory:
        return StepMemory(
            device_kind=self.device_kind,
            peak_allocated_bytes=allocated,
            peak_reserved_bytes=reserved,
            allocated_definition=ALLOCATED_DEFINITIONS[self.device_kind],
            reserved_definition=RESERVED_DEFINITIONS[self.device_kind],
            reserved_unavailable_reason=reason,
            **fields,
        )

    def _tracker_fields(self) -> dict:
        tr = self.tracker
        assert tr is not None
        fields = dict(
            baseline_bytes=tr.baseline_bytes,
            end_allocated_bytes=tr.live_bytes,
            adopted_bytes=tr.adopted_bytes,
            ops_seen=tr.op_index,
            marks=list(tr.marks),
        )
        if tr.track_categories:
            fields["categories_at_peak"] = dict(tr.categories_at_peak)
            fields["categories_at_end"] = dict(tr.category_bytes)
            fields["by_module_at_peak"] = tr.by_module_at_peak()
            fields["timeline"] = list(tr.timeline)
        tr.release()
        return fields

    def start_step(self, baseline_tensors=(), *, model=None, optimizer=None) -> None:
        if self.tracker is not None and self.tracker._active:
            raise MemoryMeterError("the memory meter is already measuring a step: stop it first")
        self.tracker = self.tracker_class(
            track_categories=self.track_categories, scratch=self.scratch
        )
        self._start_extra()
        self.tracker.begin(baseline_tensors=baseline_tensors, model=model, optimizer=optimizer)

    def _start_extra(self) -> None:
        pass

    def stop_step(self) -> StepMemory:
        if self.tracker is None or not self.tracker._active:
            raise MemoryMeterError("stop_step without start_step")
        self.tracker.end()
        reserved, reason = self._stop_extra()
        peak = self.tracker.peak_bytes
        return self._result(peak, reserved, reason, **self._tracker_fields())

    def _stop_extra(self) -> tuple[int | None, str | None]:
        return None, "the storage tracker measures no reserved memory"


class CpuMemoryMeter(TrackedMemoryMeter):
    """Adds the peak resident set of the whole process over the step."""

    device_kind = "cpu"

    def _start_extra(self) -> None:
        self._rss_reason = None
        try:
            with open(_CLEAR_REFS, "w") as f:
                f.write("5")
        except OSError as exc:
            self._rss_reason = f"could not reset the resident-set peak ({_CLEAR_REFS}: {exc})"

    def _stop_extra(self) -> tuple[int | None, str | None]:
        if self._rss_reason is not None:
            return None, self._rss_reason
        try:
            with open(_STATUS) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        value, unit = line.split()[1:3]
                        return int(value) * {"kB": 1024, "mB": MIB}.get(unit, 1024), None
        except (OSError, ValueError, IndexError) as exc:
            return None, f"could not read VmHWM from {_STATUS}: {exc}"
        return None, f"no VmHWM line in {_STATUS}"


class CudaMemoryMeter(TrackedMemoryMeter):
    """CUDA and ROCm (HIP builds use the same ``torch.cuda`` API)."""

    def __init__(self, device, *, track_categories=False):
        super().__init__(device, track_categories=track_categories)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.device_kind = "rocm" if torch.version.hip else "cuda"
        self._started = False

    def start_step(self, baseline_tensors=(), *, model=None, optimizer=None) -> None:
        if self._started:
            raise MemoryMeterError("the memory meter is already measuring a step: stop it first")
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        if self.track_categories:
            self.tracker = StorageTracker(track_categories=True)
            self.tracker.begin(baseline_tensors=baseline_tensors, model=model, optimizer=optimizer)
        self._started = True

    def stop_step(self) -> StepMemory:
        if not self._started:
            raise MemoryMeterError("stop_step without start_step")
        torch.cuda.synchronize(self.device)
        allocated = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        fields = {}
        if self.tracker is not None:
            self.tracker.end()
            fields = self._tracker_fields()
            self.tracker = None
        self._started = False
        return self._result(allocated, reserved, **fields)


def make_meter(device: torch.device | str, track_categories: bool = False) -> TrackedMemoryMeter:
    device = torch.device(device)
    if device.type == "cuda":
        return CudaMemoryMeter(device, track_categories=track_categories)
    if device.type == "cpu":
        return CpuMemoryMeter(device, track_categories=track_categories)
    raise HeptstudyError(
        f"no memory meter for device type {device.type!r}; supported: cuda (also ROCm) and cpu. "
        "Run the measurement on one of these devices."
    )
