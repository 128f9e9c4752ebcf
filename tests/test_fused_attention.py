"""The fused (flex_attention) path compiles a bounded number of times and never runs unfused
without an error. On CPU the compiled call runs flex_attention's dense implementation (the
``eager`` compiler) and only forward: the dynamo layer that decides compiles, recompile limits
and fallbacks is the same one the CUDA (inductor) path goes through."""

import contextlib
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from heptstudy.errors import HeptstudyError
from heptstudy.model import build_model, example_batch, flex_kernel
from heptstudy.model.flex_kernel import FusedAttentionError, flex_attention_lse
from heptstudy.model.fused_attention import bucket_block_mask

BLOCK = 16


@pytest.fixture
def fresh_dynamo():
    """No compiled flex_attention from earlier tests, default policy, counts from zero."""
    torch._dynamo.reset()
    flex_kernel.reset_counts()
    flex_kernel.set_shape_policy("dynamic")
    yield
    flex_kernel.set_shape_policy("dynamic")
    torch._dynamo.reset()


def _qkv_mask(seq_len, dtype=torch.float32, batch_rounds=2):
    gen = torch.Generator().manual_seed(seq_len)
    q, k, v = (torch.randn(batch_rounds, 1, seq_len, 4, generator=gen, dtype=dtype) for _ in "qkv")
    valid = (torch.arange(seq_len) < seq_len - 7).expand(batch_rounds, -1)
    return q, k, v, bucket_block_mask(valid, BLOCK)


#: What flex_attention says when it runs unfused. It says it once per process, but
#: flex_attention_lse clears that record before each call, so every unfused run says it again;
#: if PyTorch moves the record, the slipped-through test below fails.
UNFUSED = "called without torch.compile"


@contextlib.contextmanager
def _says_nothing_unfused():
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        yield
    assert not [w for w in said if UNFUSED in str(w.message)]


def test_twelve_lengths_compile_at_most_twice_and_never_unfused(fresh_dynamo):
    lengths = [flex_kernel.kernel_length(272 + 16 * i) for i in range(12)]
    assert len(set(lengths)) == 12
    with torch.no_grad():
        for n in lengths:
            q, k, v, mask = _qkv_mask(n)
            with _says_nothing_unfused():
                out, lse = flex_attention_lse(q, k, v, mask)
            assert out.shape == q.shape and lse.shape == q.shape[:-1]
            # the kernel's answer: softmax attention inside each bucket over valid keys
            idx = torch.arange(n)
            allowed = (idx[:, None] // BLOCK == idx[None, :] // BLOCK) & (idx[None, :] < n - 7)
            scores = (q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
            ref_lse = torch.logsumexp(scores, -1)
            rows = torch.isfinite(ref_lse)
            torch.testing.assert_close(lse[rows], ref_lse[rows], rtol=1e-4, atol=1e-4)
    s = flex_kernel.attention_status()
    assert s["fused_calls"] == 12 and s["fused_kernel_lengths"] == 12
    assert 1 <= s["fused_compiles"] <= 2, s
    assert s["fused_compiler"] == "eager"


def test_short_sequences_share_the_compile(fresh_dynamo):
    # padded to two blocks: no size of 1 for dynamo to specialise on
    with torch.no_grad():
        for n in (32, 112, 128, 300):
            flex_attention_lse(*_qkv_mask(flex_kernel.kernel_length(n)))
    assert flex_kernel.attention_status()["fused_compiles"] == 1


def test_forced_recompile_limit_is_a_clear_error_not_an_unfused_run(fresh_dynamo):
    with (
        torch.no_grad(),
        torch._dynamo.config.patch(recompile_limit=1),
        _says_nothing_unfused(),
    ):
        flex_attention_lse(*_qkv_mask(256))
        # float64 needs a second compile, which the limit of 1 forbids
        with pytest.raises(FusedAttentionError) as err:
            flex_attention_lse(*_qkv_mask(272, dtype=torch.float64))
    text = str(err.value)
    assert "recompile limit" in text and "attention_backend=plain" in text
    assert isinstance(err.value, HeptstudyError)  # the CLI prints it as one line
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert torch._dynamo.config.recompile_limit == 8  # restored


class _BlockingMode(TorchDispatchMode):
    """A dispatch mode that does not let torch.compile run (the default)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_a_mode_that_blocks_compile_is_refused_before_running(fresh_dynamo):
    q, k, v, mask = _qkv_mask(256)
    with (
        torch.no_grad(),
        _BlockingMode(),
        pytest.raises(FusedAttentionError, match="_BlockingMode"),
    ):
        flex_attention_lse(q, k, v, mask)
    assert flex_kernel.attention_status()["fused_calls"] == 0


class _FailingMode(TorchDispatchMode):
    """Lets torch.compile run, then fails the first op that reaches it."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} refused by the test")


def test_an_unfused_run_that_slips_through_is_caught_after_it(fresh_dynamo):
    # the last line of defence: the compiled call ran eagerly (as after torch 2.11's silent
    # recompile-limit fallback; here the "force_eager" stance) for a reason the checks before
    # it did not catch; flex_attention's unfused path marks the run and the call is refused.
    # Twice: the mark is a once-per-process record that flex_attention_lse clears before each
    # call (if PyTorch moves that record, this test fails).
    q, k, v, mask = _qkv_mask(256)
    eager = torch.compiler.set_stance("force_eager")
    for _ in range(2):
        with torch.no_grad(), eager, pytest.warns(UserWarning, match=UNFUSED):
            with pytest.raises(FusedAttentionError, match="fell back to its unfused path.*and ran"):
                flex_attention_lse(q, k, v, mask)
    # ... and one that then fails on its own says so too
    with torch.no_grad(), eager, _FailingMode(), pytest.warns(UserWarning, match=UNFUSED):
        with pytest.raises(FusedAttentionError, match="unfused path.*and then failed.*by the test"):
            flex_attention_lse(q, k, v, mask)


def test_no_backward_on_cpu_is_said_before_running(fresh_dynamo):
    q, k, v, mask = _qkv_mask(256)
    q.requires_grad_(True)
    with pytest.raises(FusedAttentionError, match="no backward on CPU"):
        flex_attention_lse(q, k, v, mask)


def test_ladder_policy_pads_to_fixed_sizes_and_matches_plain(fresh_dynamo, tiny_overrides):
    from heptstudy.config import load_config

    flex_kernel.set_shape_policy("ladder")
    assert flex_kernel.kernel_length(100) == 128 and flex_kernel.kernel_length(129) == 256
    assert all(n % 128 == 0 for n in flex_kernel.LADDER)
    models = {}
    for backend in ("plain", "fused"):
        cfg = load_config(overrides=tiny_overrides + [f"model.heptv2.attention_backend={backend}"])
        torch.manual_seed(0)
        models[backend] = build_model(cfg).eval()
    batch = example_batch(cfg, 2, [150, 40], seed=3)  # sorted length 160 -> kernel length 256
    with torch.no_grad():
        a, b = models["plain"](batch), models["fused"](batch)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-4)
    assert flex_kernel.attention_status()["fused_shape_policy"] == "ladder"
    with pytest.raises(FusedAttentionError, match="allowed: dynamic, ladder"):
        flex_kernel.set_shape_policy("bucketed")


def test_status_names_the_backend_used(fresh_dynamo, tiny_overrides):
    from heptstudy.config import load_config

    cfg = load_config(overrides=tiny_overrides + ["model.heptv2.attention_backend=plain"])
    assert flex_kernel.attention_status(cfg)["backend_used"] == "plain"
    with torch.no_grad():
        flex_attention_lse(*_qkv_mask(256))
    s = flex_kernel.attention_status(cfg)
    assert s["backend_used"] == "fused-reference" and s["configured"] == "plain"
    assert s["fused_compiles"] == 1
    # the block every bench report carries in environment.attention
    from heptstudy.measure.report import AttentionInfo

    info = AttentionInfo(**flex_kernel.attention_status(cfg))
    assert (info.backend_used, info.fused_calls, info.fused_compiler) == (
        "fused-reference",
        1,
        "eager",
    )
