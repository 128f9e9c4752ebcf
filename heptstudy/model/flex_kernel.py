"""The one call into ``flex_attention``: compiled a bounded number of times, never silently
unfused (past dynamo's recompile limit it quietly materialises the whole score matrix: on an
H200 2.2 GB became 67-78 GB, ``experiments/h200_2026-11-30/``), counted. ``eager`` on CPU:
inductor's CPU kernel has no backward nor log-sum-exp."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from heptstudy.config import HIT_VARIANT
from heptstudy.errors import HeptstudyError

SHAPE_POLICIES = ("dynamic", "ladder")

FLEX_BLOCK = 128

#: Two blocks: dynamo specialises block-mask sizes of 1, which would cost a second compile.
MIN_DYNAMIC_LENGTH = 2 * FLEX_BLOCK

#: Kernel sequence lengths of the ``ladder`` policy: 128 x ceil(2^(k/4)), up to 2^19 rows.
LADDER = tuple(sorted({FLEX_BLOCK * math.ceil(2 ** (k / 4)) for k in range(4 * 12 + 1)}))

#: Static compiles ``ladder`` may need; dynamo's limit is raised to it for these calls only.
LADDER_RECOMPILE_LIMIT = 64

WAY_OUT = (
    "Run with the plain attention instead: --set model.heptv2.attention_backend=plain "
    "(the same result without flex_attention), or use a platform profile whose "
    "attention_backend is plain"
)

# flex_attention's eager path records this warning id whenever it runs unfused.
_UNFUSED_WARNING_ID = "flex_attention_performance"


class FusedAttentionError(HeptstudyError, RuntimeError):
    """The fused attention would run (or ran) unfused, or failed to compile."""


@dataclass
class _Stats:
    calls: int = 0
    compiles: int = 0
    compiler: str | None = None
    lengths: set[int] = field(default_factory=set)


_STATS = _Stats()
_POLICY = "dynamic"
_COMPILED: dict[tuple[str, str], object] = {}


def set_shape_policy(policy: str) -> None:
    global _POLICY
    if policy not in SHAPE_POLICIES:
        raise FusedAttentionError(
            f"fused attention shape policy {policy!r} is not allowed; allowed: "
            f"{', '.join(SHAPE_POLICIES)}"
        )
    _POLICY = policy


def kernel_length(padded_len: int) -> int:
    if _POLICY == "dynamic":
        return max(padded_len, MIN_DYNAMIC_LENGTH)
    for size in LADDER:
        if size >= padded_len:
            return size
    raise FusedAttentionError(
        f"a sorted sequence of {padded_len} rows is longer than the largest ladder size "
        f"{LADDER[-1]}; use the dynamic shape policy or the plain attention. {WAY_OUT}"
    )


def attention_status(config=None) -> dict:
    """The bucket attention actually used, the configured backend and the fused call counts."""
    if _STATS.calls:
        used = "fused" if _STATS.compiler == "inductor" else "fused-reference"
    elif config is not None and config.model.variant == HIT_VARIANT:
        used = "plain"
    else:
        used = "none"
    configured = config.model.heptv2.attention_backend if config is not None else None
    return {
        "backend_used": used,
        "configured": configured,
        "fused_calls": _STATS.calls,
        "fused_compiles": _STATS.compiles,
        "fused_compiler": _STATS.compiler,
        "fused_shape_policy": _POLICY,
        "fused_kernel_lengths": len(_STATS.lengths),
    }


def reset_counts() -> None:
    """Forget the counts (compiled code stays cached)."""
    global _STATS
    _STATS = _Stats()


def flex_attention_lse(q, k, v, block_mask):
    """``(out, lse)`` of ``flex_attention(..., scale=1)`` through the checked compile."""
    from torch.nn.attention import flex_attention as fa

    compiler = "inductor" if q.device.type == "cuda" else "eager"
    if (
        q.device.type == "cpu"
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (q, k, v))
    ):
        raise FusedAttentionError(
            "the fused attention has no backward on CPU (flex_attention supports only "
            f"inference there). {WAY_OUT}"
        )
    kwargs = {"block_mask": block_mask, "scale": 1.0, "return_aux": fa.AuxRequest(lse=True)}
    if torch.compiler.is_compiling():  # inside a caller's own compiled region: it compiles us
        result = fa.flex_attention(q, k, v, **kwargs)
    else:
        _refuse_known_fallbacks(fa)
        fn = _compiled(compiler)
        before = _cache_entries(fa)
        with _checked(fa, compiler):
            result = fn(q, k, v, **kwargs)
        _STATS.compiles += max(0, _cache_entries(fa) - before)
        _STATS.compiler = compiler
    _STATS.calls += 1
    _STATS.lengths.add(int(q.shape[-2]))
    out, aux = result
    return out, aux.lse


def _compiled(compiler: str):
    key = (compiler, _POLICY)
    if key not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED[key] = torch.compile(
            flex_attention, backend=compiler, dynamic=_POLICY == "dynamic"
        )
    return _COMPILED[key]


def _cache_entries(fa) -> int:
    # private torch API: the fallback counts dynamo's graphs where this is missing (torch 2.11
    # on the GPU machine is older than the 2.13 tested here)
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(fa.flex_attention.__code__))
    except (ImportError, AttributeError, RuntimeError):
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])


def _refuse_known_fallbacks(fa) -> None:
    """Refuse what would make dynamo skip the call, before anything runs."""
    if getattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False):
        raise FusedAttentionError(
            "flex_attention's compile is switched off "
            "(torch.nn.attention.flex_attention._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True): "
            f"the fused attention would run unfused. Set it back to False. {WAY_OUT}"
        )
    if torch._dynamo.config.disable:
        raise FusedAttentionError(
            "torch._dynamo is disabled (torch._dynamo.config.disable / TORCHDYNAMO_DISABLE=1): "
            f"the fused attention would run unfused. Enable it again. {WAY_OUT}"
        )
    from torch.utils import _python_dispatch as pd

    for mode in pd._get_current_dispatch_mode_stack():
        infra = getattr(mode, "is_infra_mode", None)
        ignores = getattr(mode, "ignore_compile_internals", None)
        if (infra is not None and infra()) or (ignores is not None and ignores()):
            continue
        raise FusedAttentionError(
            f"a TorchDispatchMode ({type(mode).__name__}) is active and does not let "
            "torch.compile run (its ignore_compile_internals() is False): the fused attention "
            "would run unfused, materialising the whole score matrix. Measure without that "
            f"mode, or give it ignore_compile_internals() = True. {WAY_OUT}"
        )


@contextlib.contextmanager
def _checked(fa, compiler: str):
    """Failures as :class:`FusedAttentionError`; out-of-memory passes through (it is a result)."""
    from torch._dynamo import exc as dynamo_exc
    from torch.fx.experimental import _config as fx_config

    limit_hit = getattr(dynamo_exc, "FailOnRecompileLimitHit", ())
    patch = {"fail_on_recompile_limit_hit": True}
    if _POLICY == "ladder" and torch._dynamo.config.recompile_limit < LADDER_RECOMPILE_LIMIT:
        patch["recompile_limit"] = LADDER_RECOMPILE_LIMIT
    # the ids of the warnings flex_attention has given (private: a set of our own where absent)
    shown = getattr(fa, "_WARNINGS_SHOWN", set())
    shown.discard(_UNFUSED_WARNING_ID)
    try:
        # no "duck sizing": sizes that happen to be equal once would cost a recompile later
        no_duck = (
            fx_config.patch(use_duck_shape=False)
            if hasattr(fx_config, "use_duck_shape")
            else contextlib.nullcontext()
        )
        with torch._dynamo.config.patch(**patch), no_duck:
            yield
    except limit_hit:
        raise FusedAttentionError(
            f"flex_attention reached dynamo's recompile limit "
            f"(torch._dynamo.config.recompile_limit={torch._dynamo.config.recompile_limit}) "
            f"after {_STATS.compiles} compiles in this process (shape policy {_POLICY}); "
            "dynamo would now run it unfused, materialising the whole score matrix. Raise the "
            f"limit only if the compiles are expected. {WAY_OUT}"
        ) from None
    except dynamo_exc.TorchDynamoException as err:
        inner = getattr(err, "inner_exception", None)
        if isinstance(inner, torch.OutOfMemoryError):
            raise inner from None
        raise FusedAttentionError(
            f"flex_attention failed to compile with torch.compile(backend={compiler!r}) "
            f"({_first_line(err)}); torch {torch.__version__}. {WAY_OUT}"
        ) from None
    except Exception as err:
        if _UNFUSED_WARNING_ID in shown:
            raise FusedAttentionError(_fell_back(f"and then failed ({_first_line(err)})")) from None
        raise
    if _UNFUSED_WARNING_ID in shown:
        raise FusedAttentionError(_fell_back("and ran"))


def _fell_back(what: str) -> str:
    return (
        "flex_attention fell back to its unfused path (the 'called without torch.compile' "
        f"path, which materialises the whole score matrix) {what}: the compiled call was "
        f"skipped by dynamo. {WAY_OUT}"
    )


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300] if text else ''}"
