"""The target-faithful fake step: CUDA autocast's lists emulated on CPU tensors, the target's
kernel choices, kernel scratch, and the fake step that uses them."""

import time
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from heptstudy.config import load_config
from heptstudy.estimate.autocast_policy import lists_for, target_autocast
from heptstudy.estimate.kernel_scratch import SCRATCH, scratch_bytes
from heptstudy.estimate.kernel_stand_ins import target_kernels
from heptstudy.meters.memory import iter_tensors
from tests.conftest import TINY_MODEL

BF16 = torch.bfloat16


def _dtypes():
    """One op of each CUDA list, under a CPU autocast region (bf16)."""
    x = torch.randn(4, 8)
    xb = x.to(BF16)
    out = {}
    with torch.autocast("cpu", dtype=BF16):
        out["lower_precision:mv"] = torch.mv(x, x[0]).dtype
        out["fp32:exp"] = torch.exp(xb).dtype
        out["fp32_set_opt_dtype:softmax"] = torch.softmax(xb, -1).dtype
        try:
            out["promote:dot"] = torch.dot(x[0], xb[0]).dtype
        except RuntimeError:  # CPU autocast does not promote dot: mixed dtypes are refused
            out["promote:dot"] = "error"
        out["rms_norm"] = F.rms_norm(xb, (8,)).dtype
    return out


def test_emulated_policy_gives_cuda_dtypes_and_leaves_nothing_behind():
    cpu = _dtypes()
    with target_autocast("2.11") as emu:
        cuda_211 = _dtypes()
    with target_autocast("2.13"):
        rocm_213 = _dtypes()
    after = _dtypes()
    expected = {
        "lower_precision:mv": BF16,
        "fp32:exp": torch.float32,
        "fp32_set_opt_dtype:softmax": torch.float32,
        "promote:dot": torch.float32,
        "rms_norm": BF16,  # 2.11: not on CUDA's fp32 list yet
    }
    assert cuda_211 == expected
    assert rocm_213 == {**expected, "rms_norm": torch.float32}  # 2.12 moved it to fp32
    # CPU autocast differs on each of these lists, and is back once the context has exited
    for key in ("lower_precision:mv", "fp32:exp", "fp32_set_opt_dtype:softmax", "promote:dot"):
        assert cpu[key] != expected[key], key
    assert after == cpu
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::exp", "AutocastCPU")
    assert emu.calls["exp"] == 1 and emu.calls["softmax.int"] == 1 and not emu.missing


def test_shared_lower_precision_ops_keep_cpus_cached_cast():
    lin = torch.nn.Linear(8, 8)
    x, m = torch.randn(2, 8, requires_grad=True), torch.randn(2, 8, 8)
    with target_autocast("2.11") as emu, torch.autocast("cpu", dtype=BF16):
        a, b = lin(x), lin(x)
        outs = [torch.mm(x, x.t()), torch.bmm(m, m), torch.matmul(x, x.t())]
        outs += [torch.addmm(x, x, m[0]), torch.baddbmm(m, m, m), torch.addbmm(m[0], m, m)]
    assert all(o.dtype == BF16 for o in [a, b, *outs])
    assert {"linear", "mm", "bmm", "matmul", "addmm", "baddbmm"} <= set(emu.kept_cpu)
    # the CUDA ops CPU autocast does not cast to lower precision get the emulation's kernel
    assert not {"mv", "einsum", "addmv", "addr", "_convolution"} & set(emu.kept_cpu)
    # cached_cast: both calls saved the same bf16 copy of the weight
    w1, w2 = (t.grad_fn._saved_mat2 for t in (a, b))
    assert w1.untyped_storage().data_ptr() == w2.untyped_storage().data_ptr()


def test_unknown_version_is_refused():
    with pytest.raises(ValueError, match="2.9.*known: 2.11, 2.12, 2.13"):
        lists_for("2.9.1")
    assert "rms_norm" in lists_for("2.13.0+cu130").fp32
    assert "rms_norm" not in lists_for("2.11").fp32


def test_kernel_stand_ins_keep_the_targets_tensors():
    x = torch.randn(3, 5, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    ref = F.rms_norm(x, (8,), w, 1e-6)
    ref_grads = torch.autograd.grad(ref.square().sum(), (x, w))
    with target_kernels() as kernels:
        y = F.rms_norm(x, (8,), w, 1e-6)
        saved = list(y.grad_fn.saved_tensors)
        grads = torch.autograd.grad(y.square().sum(), (x, w))
        d = F.dropout(x, 0.1, True)
        with FakeTensorMode():  # CUDA's kernel: its fake (meta) implementation
            q = torch.randn(2, 2, 6, 4, requires_grad=True)
            mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
            o = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            lse_dtype = o.grad_fn._saved_log_sumexp.dtype
            o.sum().backward()
    torch.testing.assert_close(y, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    # fused rms_norm: the input, the weight and one float32 rstd per row
    assert [tuple(t.shape) for t in saved] == [(3, 5, 8), (8,), (3, 5, 1)]
    assert saved[2].dtype == torch.float32
    assert type(d.grad_fn).__name__ == "NativeDropoutBackward0"  # a boolean mask
    assert d.grad_fn._saved_result1.dtype == torch.bool
    assert type(o.grad_fn).__name__ == "ScaledDotProductEfficientAttentionBackward0"
    assert lse_dtype == torch.float32  # output and log-sum-exp kept, no score matrix
    assert q.grad.shape == q.shape
    assert kernels.calls == {"rms_norm": 1, "dropout": 1, "scaled_dot_product_attention": 1}
    assert type(F.dropout(x, 0.1, True).grad_fn).__name__ == "MulBackward0"  # gone again


# ---- a probe of an op's scratch: the storages its composite kernel allocates (tests only)


class _Probe(TorchDispatchMode):
    """Counts the storages allocated inside one op's composite kernel."""

    def __init__(self, op):
        super().__init__()
        self.op = op
        self.inside = False
        self.live = 0
        self.peak = 0
        self.seen: dict[int, int] = {}
        self.outside: set[int] = set()  # storages of the arguments: not the kernel's

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is self.op and not self.inside:
            self.inside = True
            try:
                if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _CEA):
                    raise ValueError(
                        f"{func} has no composite kernel to follow (CompositeExplicitAutograd): "
                        "its scratch, if any, is inside a native kernel, which a CPU probe "
                        "cannot see"
                    )
                with self:  # the kernel's own ATen calls come back through this mode
                    return func._op_dk(_CEA, *args, **kwargs)
            finally:
                self.inside = False
        key = _followed_key(func) if self.inside else None
        if key is not None:
            with self:  # follow nested kernels (e.g. an op into its out= variant)
                out = func._op_dk(key, *args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if self.inside:
            for t in iter_tensors(out):
                s = t.untyped_storage()
                key = id(s)
                if key not in self.seen and key not in self.outside:
                    self.seen[key] = s.nbytes()
                    self.live += s.nbytes()
                    weakref.finalize(s, self._free, key)
            self.peak = max(self.peak, self.live)
        return out


_CEA = torch._C.DispatchKey.CompositeExplicitAutograd
_FOLLOWED = (
    _CEA,
    torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional,
    torch._C.DispatchKey.CPU,
)


def _followed_key(op):
    """The kernel whose own ATen calls the probe follows: the composite one, else the CPU one."""
    for key in _FOLLOWED:
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
            return key
    return None


def probe(op, *args, **kwargs) -> int:
    """Peak bytes allocated inside ``op``'s composite kernel beyond its result, on these (small,
    real CPU) arguments."""
    p = _Probe(op)
    p.outside = {id(t.untyped_storage()) for t in iter_tensors([*args, *kwargs.values()])}
    with p:
        out = op(*args, **kwargs)
    kept = 0
    for t in iter_tensors(out):
        kept += p.seen.get(id(t.untyped_storage()), 0)
    return max(0, p.peak - kept)


def test_scratch_probe_finds_logsumexps_temporary():
    x = torch.randn(64, 100)
    found = probe(torch.ops.aten.logsumexp.default, x, [1], False)
    # one temporary the size of the input (self - max), plus the row maxima
    assert x.nbytes <= found <= x.nbytes * 1.05
    rule = SCRATCH[torch.ops.aten.logsumexp.default]
    assert abs(rule.bytes_for((x, [1], False)) - found) <= 0.05 * found
    # the table's binary_cross_entropy_with_logits rules agree with the probe
    t = torch.rand(64, 100)
    bce = torch.ops.aten.binary_cross_entropy_with_logits.default
    for reduction in (0, 1):
        args = (x, t, None, None, reduction)
        assert abs(scratch_bytes(bce, args) - probe(bce, *args)) <= 0.05 * x.nbytes


def test_tracker_counts_scratch_as_a_transient():
    from heptstudy.meters.memory import StorageTracker

    x = torch.randn(256, 256)
    plain, with_scratch = StorageTracker(), StorageTracker(scratch=scratch_bytes)
    for tracker in (plain, with_scratch):
        tracker.begin(baseline_tensors=[x])
        torch.logsumexp(x, dim=1)
        tracker.end()
    assert with_scratch.peak_bytes - plain.peak_bytes == x.nbytes
    assert with_scratch.scratch_ops == {"aten.logsumexp.default": 1}


def _tiny_bf16_config(data_dir, checkpointing: str):
    return load_config(
        overrides=TINY_MODEL
        + [
            f"data.data_dir={data_dir}",
            "train.dtype=bfloat16",
            f"model.heptv2.activation_checkpointing={checkpointing}",
        ]
    )


@pytest.mark.parametrize("checkpointing", ["false", "true"])
def test_target_faithful_fake_step_runs_the_tiny_model(tiny_data_dir, checkpointing):
    from heptstudy.data.batching import load_events
    from heptstudy.estimate.fake_step import estimate_step

    cfg = _tiny_bf16_config(tiny_data_dir, checkpointing)
    batch = load_events(cfg, [0, 5, 9])
    started = time.perf_counter()
    est = estimate_step(cfg, batch, target="cuda", torch_version="2.11")
    assert time.perf_counter() - started < 30
    assert est.target == "cuda" and est.torch_version == "2.11"
    assert est.peak_allocated_bytes > est.baseline_bytes > 0
    # measured, not assumed: what the current model hits of the target's lists and kernels
    assert est.autocast_calls["layer_norm"] > 0  # CUDA: float32 (CPU autocast: bf16)
    assert est.stand_in_calls["scaled_dot_product_attention"] > 0  # the decoder's attention
    assert "dropout" not in est.stand_in_calls  # the model keeps a boolean mask itself
    assert "rms_norm" not in est.stand_in_calls  # the model's own RMSNorm function
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::dropout", "AutogradCPU")
    with pytest.raises(Exception, match="unknown estimate target 'tpu'"):
        estimate_step(cfg, batch, target="tpu")


@pytest.mark.parametrize("checkpointing", ["full", "selective"])
def test_skipping_repeated_slices_changes_no_figure(tiny_data_dir, monkeypatch, checkpointing):
    """The fake step skips repeats of the sliced loops; with small slices (many iterations) every
    figure the estimate gives is the same as with every iteration run."""
    from heptstudy.data.batching import load_events
    from heptstudy.estimate.bench_process import simulate_bench_process
    from heptstudy.estimate.fake_step import estimate_step
    from heptstudy.model import heptv2

    monkeypatch.setattr(heptv2, "SWIGLU_SLICE_ELEMENTS", 1 << 12)
    monkeypatch.setattr(heptv2, "ATTENTION_SLICE_ELEMENTS", 1 << 14)
    monkeypatch.setattr(heptv2, "BUCKET_CHUNK_ELEMENTS", 1 << 11)
    cfg = _tiny_bf16_config(tiny_data_dir, checkpointing)
    batch = load_events(cfg, [0, 5, 9])
    figures, events = {}, {}
    for skip in (True, False):
        est = estimate_step(cfg, batch, target="cuda", record_trace=True, skip_repeats=skip)
        # a process of two such steps: the second starts from the first's cached blocks
        sim = simulate_bench_process([est.trace] * 2, warmup=1)
        figures[skip] = (
            est.peak_allocated_bytes,
            [(p.peak_allocated, p.peak_reserved) for p in sim.native + sim.expandable],
        )
        events[skip] = len(est.trace.events)
    assert figures[True] == figures[False]
    if checkpointing == "full":  # selective keeps each slice's products: no iteration repeats
        assert events[True] < 0.75 * events[False]
