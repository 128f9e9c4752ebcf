"""Atomic file writes: a temporary file in the same folder, renamed over the target, so a crash
mid-write leaves the previous file (or none), never a truncated one."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from heptstudy.errors import HeptstudyError, os_error_advice
from heptstudy.stand_ins import write_fault


def _umask() -> int:
    # os.umask is read only by setting it, racing threads creating files; Linux just reports it
    with suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class NotOurs(HeptstudyError):
    """The path to be written holds a file heptstudy did not write: it is left as it is."""


@dataclass(frozen=True)
class Output:
    """A kind of file heptstudy writes where a user names the path or the folder. The one rule of
    every output: it replaces only a file of its own kind, recognised by ``mark`` (bytes found in
    the first or last 4 KiB; a bytes pattern must match them whole), so a file the project did
    not write is never replaced."""

    what: str  # e.g. "heptstudy bench report"
    suffix: str  # e.g. ".json"
    mark: bytes | re.Pattern[bytes]

    def check(
        self, path: str | os.PathLike, option: str = "the output", *, in_folder: bool = False
    ) -> bool:
        """Refuse ``path`` unless it is free or holds this kind; True when it will be replaced.
        ``in_folder``: ``path`` is a file named by heptstudy inside the folder ``option`` gave."""
        path = Path(path)
        if not in_folder and path.suffix != self.suffix:
            raise NotOurs(
                f"{option} {str(path)!r}: a {self.what} is written to a {self.suffix} file, not a "
                f"{path.suffix or 'suffix-less'} one; nothing was written. Give a name ending in "
                f"{self.suffix}, e.g. {str(path.with_suffix(self.suffix))!r}"
            )
        if not os.path.lexists(path):
            return False
        subject = f"{option} {str(path.parent)!r}: {path.name}" if in_folder else None
        subject = subject or f"{option} {str(path)!r}"
        if path.is_symlink() or not path.is_file():
            kind = "a symbolic link" if path.is_symlink() else "not a regular file"
            raise NotOurs(
                f"{subject} is {kind}, which would be replaced; {self._keep(option, in_folder)}"
            )
        try:
            ends = _ends(path)
        except OSError as exc:
            raise NotOurs(
                f"{subject} exists and cannot be read ({exc.strerror or exc}), so it cannot be "
                f"told to be a {self.what}; {self._keep(option, in_folder)}"
            ) from None
        mark = self.mark
        if not (mark in ends if isinstance(mark, bytes) else mark.fullmatch(ends)):
            raise NotOurs(
                f"{subject} exists ({path.stat().st_size:,} bytes) and is not a {self.what}; "
                f"heptstudy replaces only its own {self.what}s, so "
                f"{self._keep(option, in_folder)}"
            )
        return True

    def _keep(self, option: str, in_folder: bool) -> str:
        other = "folder" if in_folder else f"file name ending in {self.suffix}"
        return (
            f"nothing was written. To keep it, give {option} another {other}; to replace it, "
            "move it away first"
        )


def _ends(path: Path) -> bytes:
    """The first and the last 4 KiB of ``path`` (the whole file when it is shorter than 8 KiB)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(4096)
        fh.seek(max(len(head), size - 4096))
        return head + fh.read()


def check_outputs(files: Iterable[tuple[Path, Output]], option: str) -> list[Path]:
    """Every file a command will write into the folder ``option`` gave, checked before the first
    is written (a refusal names every file heptstudy did not write); returns those it replaces."""
    replaced, refused = [], []
    for path, kind in files:
        try:
            if kind.check(path, option, in_folder=True):
                replaced.append(path)
        except NotOurs as err:
            refused.append(err)
    if len(refused) > 1:
        raise NotOurs("\n".join(str(err) for err in refused))
    if refused:
        raise refused[0]
    return replaced


def write_output_files(files: Sequence[tuple[Path, str, Output]], option: str) -> list[Path]:
    """The one writer of a command's files in a folder: all checked first (:func:`check_outputs`),
    then each written atomically."""
    check_outputs(((path, kind) for path, _, kind in files), option)
    return [atomic_write_text(path, text, kind=kind) for path, text, kind in files]


@contextmanager
def atomic_path(
    path: str | os.PathLike, suffix: str = ".tmp", kind: Output | None = None
) -> Iterator[Path]:
    """A temporary path (ending in ``suffix``) next to ``path`` that replaces it when the block
    succeeds; with ``kind``, a file of another kind at ``path`` is refused first."""
    path = Path(path)
    if kind is not None:
        kind.check(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder as the target: os.replace is only atomic within one file system.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if (fault := write_fault(str(path))) is not None:
            raise fault
        with open(tmp, "rb") as fh:  # the rename must not reach the disk before the data does
            os.fsync(fh.fileno())
        try:  # mkstemp makes 0600 files: give the mode a plain open() would have left
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_leftovers(path: str | os.PathLike, suffix: str = ".tmp") -> None:
    """Remove killed writes' temporary files of ``path``; only while holding its folder."""
    path = Path(path)
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}{suffix}"):
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "w", kind: Output | None = None, **kwargs: Any
) -> Iterator[IO[Any]]:
    """:func:`open` for writing, made atomic: ``path`` changes only if the block completes."""
    if "w" not in mode:
        raise ValueError(f"atomic_open writes a whole new file; mode {mode!r} has no 'w'")
    with atomic_path(path, kind=kind) as tmp, open(tmp, mode, **kwargs) as fh:
        yield fh


def atomic_write_text(path: str | os.PathLike, text: str, kind: Output | None = None) -> Path:
    with atomic_open(path, "w", kind=kind, encoding="utf-8") as fh:
        fh.write(text)
    return Path(path)


class NotJson(HeptstudyError, ValueError):
    """A value to be written holds a number JSON cannot hold (NaN, an infinity)."""


def first_non_finite(value: Any, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in ``value`` (dicts and lists within): its dotted path and it."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    items = value.items() if isinstance(value, dict) else ()
    for key, item in enumerate(value) if isinstance(value, (list, tuple)) else items:
        if (found := first_non_finite(item, f"{where}.{key}" if where else str(key))) is not None:
            return found
    return None


def json_text(value: Any, what: str) -> str:
    """``value`` as indented JSON text; NaN and the infinities, not JSON, are refused."""
    if (found := first_non_finite(value)) is not None:
        raise NotJson(
            f"{what}: {found[0] or 'the value'} is {found[1]}, which JSON cannot hold; nothing "
            "was written. A result that is not a number is a failed measurement or a value out "
            "of range: fix the input that gave it"
        )
    return json.dumps(value, indent=2, allow_nan=False) + "\n"


class WriteFailed(HeptstudyError):
    """A result could not be written; the message says where it went instead."""


def write_text_or_keep(
    path: str | os.PathLike, text: str, what: str, kind: Output | None = None
) -> Path:
    """:func:`atomic_write_text`; refused, the text is kept in a temporary file or printed, and
    :class:`WriteFailed` says where."""
    try:
        return atomic_write_text(path, text, kind=kind)
    except OSError as exc:
        error = exc
    name = Path(path).name or "result"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"heptstudy-kept-{name}.", suffix=".txt")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                if (fault := write_fault(tmp)) is not None:
                    raise fault
                fh.write(text)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        kept = f"it is kept in {tmp}"
    except OSError:
        print(f"----- {what} (could not be written to {path}) -----\n{text}", end="")
        print(f"----- end of {what} -----", flush=True)
        kept = "it is printed above in full, between the ----- lines"
    raise WriteFailed(
        f"{what} could not be written to {str(path)!r}: {error.strerror or error}"
        f"{f' ({error.filename})' if error.filename else ''}; {kept}. "
        f"{os_error_advice(error)}, then copy it into place, or run again with another output"
    ) from None


def free_space_problem(folder: str | os.PathLike, need_bytes: int) -> str | None:
    """Why ``need_bytes`` will not fit in ``folder`` (its nearest existing parent), or None."""
    folder = Path(folder)
    if (existing := next((p for p in (folder, *folder.parents) if p.exists()), None)) is None:
        return None
    try:
        st = os.statvfs(existing)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= need_bytes:
        return None
    return (
        f"{existing} has {free / 2**20:,.1f} MiB free, about {need_bytes / 2**20:,.1f} MiB are "
        "needed"
    )


def figure_kind(path: Path) -> Output | None:
    """What a figure may replace: a figure, recognised by the name matplotlib writes in every
    PNG's and PDF's metadata (older committed figures carry nothing else)."""
    if path.suffix in (".png", ".pdf"):
        return Output(f"matplotlib {path.suffix[1:]} figure", path.suffix, b"Matplotlib")
    return None


def atomic_savefig(fig: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """A figure, atomically (the temporary file keeps the suffix matplotlib takes the format
    from); an existing file that is not a figure is refused."""
    path = Path(path)
    with atomic_path(path, suffix=path.suffix, kind=figure_kind(path)) as tmp:
        fig.savefig(tmp, **kwargs)
    return path


def folder_write_problem(folder: str | os.PathLike, *, create: bool = False) -> str | None:
    """Why a probe file cannot be written into ``folder`` (made first with ``create``), or None."""
    folder = Path(folder)
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        return f"{str(blocker)!r} is a file, not a folder"
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        fd, probe = tempfile.mkstemp(prefix=".write-check.", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None
