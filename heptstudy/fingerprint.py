"""Fingerprints: which code a result was made from, and in words what changed since. A part's
hash covers its ``.py`` files' paths and contents: moving, adding or removing one changes it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from heptstudy.errors import HeptstudyError
from heptstudy.paths import ROOT, git, git_bytes

SCHEMA = "heptstudy.codefp/1"


def canonical(value: Any) -> Any:
    """JSON's view of ``value``, so both sides compare alike."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(canonical(value), sort_keys=True).encode()).hexdigest()


_CODE = (":(top)heptstudy", ":(top)notebooks", ":(top)configs", ":(top)pyproject.toml")


@lru_cache(maxsize=1)
def code_state() -> dict[str, Any]:
    """The commit, and a hash of the uncommitted changes (None when clean)."""
    commit = git("rev-parse", "HEAD", cwd=ROOT)
    if commit is None:
        return {"git_commit": None, "changes": None}
    diff = git("diff", "HEAD", "--", *_CODE, cwd=ROOT) or ""
    new = (git("ls-files", "--others", "--exclude-standard", "--", *_CODE, cwd=ROOT) or "").split()
    h = hashlib.sha256(diff.encode())
    for name in sorted(new):
        try:
            h.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
        except OSError:
            h.update(name.encode() + b"\0<unreadable>")
    return {"git_commit": commit.strip(), "changes": h.hexdigest()[:20] if diff or new else None}


#: A folder (ending in "/") covers every ``.py`` file below it.
PARTS: dict[str, tuple[str, ...]] = {
    "model": ("heptstudy/model/",),
    "step": (
        "heptstudy/train/step.py",
        "heptstudy/train/losses.py",
        "heptstudy/train/lamb.py",
        "heptstudy/train/optim.py",
        "heptstudy/train/precision.py",
    ),
    "estimate": (
        "heptstudy/estimate/",
        "heptstudy/meters/memory.py",
        "heptstudy/meters/allocation_trace.py",
        "heptstudy/stand_ins.py",
    ),
}
PART_WORDS = {
    "model": "model code (heptstudy/model/)",
    "step": "step code (train/step, losses, LAMB, optimizer, precision)",
    "estimate": "estimate code (fake step, simulator, tracker, stand-ins)",
}
#: Modules under estimate/ that do not make the estimate: editing them keeps estimates valid.
NOT_ESTIMATE = (
    "heptstudy/estimate/__init__.py",
    "heptstudy/estimate/keys.py",
    "heptstudy/estimate/memory_model.py",
    "heptstudy/estimate/plans.py",
    "heptstudy/estimate/predictions.py",
    "heptstudy/estimate/validation.py",
)
PARTS_OF = {"measured": ("model", "step"), "estimated": ("model", "step", "estimate")}

REGENERATE = {
    "estimated": "scripts/regenerate_fits.sh (estimated models: no GPU needed)",
    "measured": (
        "measure the configuration again on the GPU (heptstudy bench / scripts/gpu/), then "
        "scripts/regenerate_fits.sh --measured DIR"
    ),
}


def _files_of(part: str, names: Iterable[str]) -> list[str]:
    return sorted(
        n
        for n in names
        if n.endswith(".py")
        and n not in NOT_ESTIMATE
        and any(n.startswith(p) if p.endswith("/") else n == p for p in PARTS[part])
    )


def _hash(files: list[str], read: Callable[[str], bytes]) -> str:
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode() + b"\0" + read(name) + b"\0")
    return h.hexdigest()


def part_hashes(parts: Iterable[str] = tuple(PARTS), root: Path = ROOT) -> dict[str, str]:
    names = [p.relative_to(root).as_posix() for p in (root / "heptstudy").rglob("*.py")]
    return {p: _hash(_files_of(p, names), lambda n: (root / n).read_bytes()) for p in parts}


class CommitUnreadable(HeptstudyError):
    """git cannot read a commit's code here (no git, no checkout, no such commit)."""


def _git(*args: str) -> bytes:
    out = git_bytes(*args)
    if out is None:
        raise CommitUnreadable(f"git {' '.join(args)} failed in {ROOT}")
    return out


def part_hashes_at(commit: str, parts: Iterable[str] = tuple(PARTS)) -> dict[str, str]:
    names = _git("ls-tree", "-r", "--name-only", commit, "heptstudy").decode().split()
    return {p: _hash(_files_of(p, names), lambda n: _git("show", f"{commit}:{n}")) for p in parts}


def make(
    source: str,
    key: dict[str, Any],
    *,
    torch_version: str | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    """The fingerprint of a "measured"/"estimated" ``source`` model: this code's or ``commit``'s."""
    parts = PARTS_OF[source]
    if commit:
        commit = _git("rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()
    hashes = part_hashes_at(commit, parts) if commit else part_hashes(parts)
    fp = {
        "schema": SCHEMA,
        "made_from": source,
        "parts": {p: hashes[p] for p in parts},
        "config_key": key.get("model_hash"),
        "torch": torch_version or torch.__version__,
        "commit": commit,
    }
    fp["sha256"] = hashlib.sha256(
        repr(sorted((k, str(v)) for k, v in fp.items())).encode()
    ).hexdigest()
    return fp


def stale_reasons(
    fingerprint: dict[str, Any] | None, source: str, key: dict[str, Any]
) -> list[str]:
    """Why a model is not of the running code (empty: it is). A measured model's PyTorch is the
    GPU build it ran on, not compared with this process's."""
    if not fingerprint or fingerprint.get("schema") != SCHEMA:
        return ["it records no code fingerprint (made before fingerprints were kept)"]
    parts = PARTS_OF.get(source, PARTS_OF["estimated"])
    now = part_hashes(parts)
    had = fingerprint.get("parts") or {}
    reasons = [f"{PART_WORDS[part]} changed" for part in parts if had.get(part) != now[part]]
    if fingerprint.get("config_key") != key.get("model_hash"):
        reasons.append(
            f"configuration key changed (model_hash {fingerprint.get('config_key')} -> "
            f"{key.get('model_hash')})"
        )
    if source != "measured" and fingerprint.get("torch") != torch.__version__:
        reasons.append(f"PyTorch {fingerprint.get('torch')} then, {torch.__version__} now")
    return reasons


def commit_reasons(commit: str, source: str = "measured") -> list[str] | None:
    """What changed since ``commit`` in a ``source`` model's parts; ``None``: git cannot tell."""
    parts = PARTS_OF[source]
    try:
        then = part_hashes_at(commit, parts)
    except CommitUnreadable:
        return None
    now = part_hashes(parts)
    return [f"{PART_WORDS[p]} changed" for p in parts if then[p] != now[p]]
