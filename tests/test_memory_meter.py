import contextlib
import gc
import time
import types
import warnings

import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

from heptstudy.meters.memory import (
    CATEGORIES,
    MemoryMeterError,
    TrackedMemoryMeter,
    make_meter,
)
from heptstudy.meters.timing import StepTimer, summarize
from heptstudy.model import build_model, example_batch

MIB = 2**20


@contextlib.contextmanager
def measured(meter, baseline_tensors=(), *, model=None, optimizer=None):
    """One measured step around the block; ``.result`` is its StepMemory afterwards."""
    handle = types.SimpleNamespace(result=None)
    meter.start_step(baseline_tensors, model=model, optimizer=optimizer)
    try:
        yield handle
    finally:
        handle.result = meter.stop_step()


def bytes_of(tensors) -> int:
    """What ``tensors`` hold, counted by hand as elements times element size: the meter's count
    of their storages must come out the same. Each must own its whole storage, alone."""
    tensors = list(tensors)
    assert len({t.data_ptr() for t in tensors}) == len(tensors), "two tensors share a storage"
    assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in tensors)
    return sum(t.numel() * t.element_size() for t in tensors)


def batch_tensors(batch: dict) -> list[torch.Tensor]:
    return [v for v in batch.values() if isinstance(v, torch.Tensor)]


def test_known_allocation_sequence_gives_exact_bytes():
    meter = make_meter("cpu")
    kept = torch.zeros(MIB // 4)  # 1 MiB alive before the step, handed over as baseline
    shared = kept.view(4, -1)  # a view: same storage, counted once
    with measured(meter, baseline_tensors=[kept, shared, None]) as m:
        a = torch.empty(MIB // 4)  # +1 MiB  -> 2 MiB
        b = torch.empty(MIB // 2)  # +2 MiB  -> 4 MiB (peak)
        del a  # -1 MiB  -> 3 MiB
        c = torch.empty(MIB // 8)  # +0.5    -> 3.5 MiB
        v = b.view(2, -1)[1]  # view: +0
        b.mul_(2)  # in-place: +0
        d = torch.empty(64, dtype=torch.float64)  # +512 bytes
    r = m.result
    assert r.device_kind == "cpu"
    assert r.baseline_bytes == MIB
    assert r.peak_allocated_bytes == 4 * MIB
    assert r.end_allocated_bytes == MIB + 2 * MIB + MIB // 2 + 512
    assert r.adopted_bytes == 0
    assert r.peak_allocated_mib == 4.0
    assert r.peak_reserved_bytes is None or r.peak_reserved_bytes > 0
    assert r.peak_reserved_bytes is not None or r.reserved_unavailable_reason
    del b, c, v, d


def test_peak_inside_an_expression_and_unknown_inputs_are_adopted():
    meter = make_meter("cpu")
    x = torch.ones(MIB // 4)  # 1 MiB, not handed over: adopted when first used
    with measured(meter) as m:
        y = (x * 2) + 1  # x*2 (1 MiB) is alive while +1 makes another 1 MiB, then freed
    assert m.result.adopted_bytes == MIB
    assert m.result.peak_allocated_bytes == 3 * MIB
    assert m.result.end_allocated_bytes == 2 * MIB
    del y


def test_out_of_order_use_is_an_error():
    meter = make_meter("cpu")
    with pytest.raises(MemoryMeterError):
        meter.stop_step()
    meter.start_step()
    try:
        with pytest.raises(MemoryMeterError):
            meter.start_step()
    finally:
        meter.stop_step()
    with pytest.raises(Exception, match="no memory meter"):
        make_meter("xla")


def _loss(out):
    return sum(
        (v.float() * torch.linspace(0.5, 1.5, v.numel()).view_as(v)).sum() for v in out.values()
    )


def _tiny(tiny_overrides, checkpointing, seed=0):
    from heptstudy.config import load_config

    cfg = load_config(
        overrides=tiny_overrides + [f"model.heptv2.activation_checkpointing={checkpointing}"]
    )
    torch.manual_seed(seed)
    return build_model(cfg), cfg


def test_frozen_model_train_step_with_categories(tiny_overrides):
    model, cfg = _tiny(tiny_overrides, False)
    model.train()
    frozen = [p for n, p in model.named_parameters() if n.startswith("input_encoder")]
    for p in frozen:
        p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert frozen and trainable
    opt = torch.optim.AdamW(trainable, lr=1e-3)
    batch = example_batch(cfg, 2, [60, 33], seed=3)
    meter = make_meter("cpu", track_categories=True)
    # First step: gradients are created inside the measured step.
    with measured(meter, batch, model=model, optimizer=opt) as m:
        _loss(model(batch)).backward()
    opt.step()
    assert all(p.grad is None for p in frozen)
    param_bytes = bytes_of([*model.parameters(), *model.buffers()])
    grad_bytes = bytes_of(p.grad for p in trainable)
    state_bytes = bytes_of(v for s in opt.state.values() for v in s.values())
    input_bytes = bytes_of(batch_tensors(batch))
    assert m.result.baseline_bytes == param_bytes + input_bytes
    end = m.result.categories_at_end
    assert end["gradients"] == grad_bytes and end["activations"] == 0
    # Second step (forward, loss, backward): gradients and optimizer state exist beforehand.
    opt.zero_grad(set_to_none=False)
    with measured(meter, batch, model=model, optimizer=opt) as m:
        loss = _loss(model(batch))
        meter.mark("backward")
        loss.backward()
    r = m.result
    assert r.baseline_bytes == param_bytes + grad_bytes + state_bytes + input_bytes
    assert r.peak_allocated_bytes > r.baseline_bytes
    cats = r.categories_at_peak
    assert set(cats) == set(CATEGORIES)
    assert sum(cats.values()) == r.peak_allocated_bytes
    assert cats["parameters"] == param_bytes
    assert cats["gradients"] == grad_bytes
    assert cats["optimizer_state"] == state_bytes
    assert cats["activations"] > cats["temporaries"] > 0
    assert r.timeline and r.timeline[-1][0] == r.ops_seen
    assert max(b for _, b in r.timeline) == r.peak_allocated_bytes
    assert [label for _, label in r.marks] == ["backward"]


def test_meter_changes_no_result(tiny_overrides):
    model, cfg = _tiny(tiny_overrides, True)
    model.train()
    batch = example_batch(cfg, 2, [40, 21], seed=1)
    grads = []
    for meter in (None, make_meter("cpu", track_categories=True)):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        ctx = (
            measured(meter, batch, model=model)
            if meter
            else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        )
        with ctx:
            _loss(model(batch)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        assert torch.equal(grads[0][n], grads[1][n]), n


class _Wide(nn.Module):
    """Layers whose intermediate activation is 16 times wider than their input."""

    def __init__(self, dim=64, layers=4, checkpointing=False):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 16 * dim), nn.GELU(), nn.Linear(16 * dim, dim))
            for _ in range(layers)
        )
        self.checkpointing = checkpointing

    def forward(self, x):
        for block in self.blocks:
            if self.checkpointing:
                x = x + tuc.checkpoint(block, x, use_reentrant=False)
            else:
                x = x + block(x)
        return x


def _measure_wide(checkpointing):
    torch.manual_seed(0)
    model = _Wide(checkpointing=checkpointing)
    x = torch.randn(512, 64)
    meter = make_meter("cpu", track_categories=True)
    with measured(meter, [x], model=model) as m:
        loss = model(x).square().mean()
        meter.mark("backward")
        loss.backward()
    gc.collect()
    return m.result


def test_checkpointing_lowers_the_peak_and_recomputation_is_seen():
    off, on = _measure_wide(False), _measure_wide(True)
    wide = 512 * 16 * 64 * 4  # one wide activation: 2 MiB
    # Without checkpointing every layer keeps its two wide tensors (Linear output, GELU output).
    assert off.peak_allocated_bytes >= off.baseline_bytes + 4 * 2 * wide
    assert on.peak_allocated_bytes < off.peak_allocated_bytes - 4 * wide
    # Backward ops are counted: with checkpointing the peak is reached during backward, where a
    # layer's wide activations are recomputed.
    bw_start = on.marks[0][0]
    live_at_bw = dict(on.timeline)[bw_start]
    bw_peak = max(b for i, b in on.timeline if i > bw_start)
    assert bw_peak == on.peak_allocated_bytes
    assert bw_peak >= live_at_bw + 2 * wide
    # No forward activations are saved inside checkpointed blocks.
    assert on.categories_at_peak["activations"] < off.categories_at_peak["activations"] / 4


def test_real_model_checkpointing_lowers_the_peak(tiny_overrides):
    peaks = {}
    for ck in (False, True):
        model, cfg = _tiny(tiny_overrides, ck)
        model.train()
        batch = example_batch(cfg, 2, 120, seed=2)
        meter = make_meter("cpu")
        with measured(meter, batch, model=model) as m:
            _loss(model(batch)).backward()
        peaks[ck] = m.result.peak_allocated_bytes
    assert peaks[True] < 0.8 * peaks[False]


def test_tracker_runs_a_compiled_fused_forward(tiny_overrides):
    """The fused (flex_attention) backend under the tracker: the higher-order operator passes
    through, the compiled call stays compiled (no unfused fallback), the peak is recorded and
    the outputs are those of an untracked forward."""
    from heptstudy.model import flex_kernel

    model, cfg = _tiny(tiny_overrides + ["model.heptv2.attention_backend=fused"], False)
    model.eval()
    batch = example_batch(cfg, 2, [150, 40], seed=1)
    with torch.no_grad():
        untracked = model(batch)
    calls = flex_kernel.attention_status()["fused_calls"]
    meter = make_meter("cpu", track_categories=True)
    with torch.no_grad(), measured(meter, batch.values(), model=model) as m:
        tracked = model(batch)
    r = m.result
    assert flex_kernel.attention_status()["fused_calls"] == calls + cfg.model.heptv2.num_convs
    assert r.peak_allocated_bytes > r.baseline_bytes and r.ops_seen > 0
    for key in untracked:
        assert torch.equal(untracked[key], tracked[key])


def test_tracker_counts_the_outputs_of_a_higher_order_operator():
    from torch.nn.attention import flex_attention as fa

    from heptstudy.model.fused_attention import bucket_block_mask

    q = torch.randn(2, 2, 256, 8)
    mask = bucket_block_mask(torch.arange(256) < torch.tensor([[250], [100]]), 16)
    meter = make_meter("cpu")
    with warnings.catch_warnings(), measured(meter, [q, mask.kv_indices]) as m:
        # the unfused path is the point here; flex_attention warns about it once per process
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        out, aux = fa.flex_attention(q, q, q, block_mask=mask, return_aux=fa.AuxRequest(lse=True))
    r = m.result
    # the HOP's outputs are counted; its inside (the dense score matrix here) is not seen
    assert r.peak_allocated_bytes - r.baseline_bytes >= out.nbytes + aux.lse.nbytes


def test_fake_tensors_are_tracked_like_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def run(meter):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 8))
        x = torch.randn(100, 32)
        with measured(meter, [x], model=model) as m:
            model(x).sum().backward()
        return m.result

    real = run(TrackedMemoryMeter("cpu"))
    with FakeTensorMode():
        fake = run(TrackedMemoryMeter("cpu"))
    assert fake.peak_allocated_bytes == real.peak_allocated_bytes > 0
    assert fake.peak_reserved_bytes is None and fake.reserved_unavailable_reason


def test_missing_proc_gives_no_reserved_and_a_reason(monkeypatch):
    import builtins

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):  # a system without /proc (or one that refuses it)
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    with measured(make_meter("cpu")) as m:
        torch.empty(10)
    assert m.result.peak_reserved_bytes is None
    assert "clear_refs" in m.result.reserved_unavailable_reason


def test_step_timer_times_each_step():
    timer = StepTimer("cpu")
    with timer.step():
        time.sleep(0.01)
    assert timer.seconds >= 0.01
    assert summarize([1.0, 3.0])[1] == pytest.approx(2**0.5)
    assert summarize([2.0]) == (2.0, 0.0, 2.0)
    assert summarize([]) == (None, None, None)
