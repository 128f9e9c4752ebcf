"""A folder held by one run at a time: a lock file for as long as a command writes into it.
The kernel drops the ``flock`` however its process dies, so a killed run's lock file is seen
to be free and taken over, saying so."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from heptstudy.errors import HeptstudyError

LOCK_NAME = ".heptstudy.lock"


class FolderInUse(HeptstudyError):
    """Another run holds the folder."""


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)  # a lock is one short line; anything longer is not one
    try:
        info = json.loads(raw.decode("utf-8") or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"unreadable": True}
    return info if isinstance(info, dict) else {"unreadable": True}


def _describe(info: dict) -> str:
    if "unreadable" in info:
        return "a process whose lock file does not hold a heptstudy lock's fields"
    return (
        f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"
        f" ({info.get('command')})"
    )


class NotALock(HeptstudyError):
    """The lock's path holds something this project did not write: it is left as it is."""


_LOCK_KEYS = {"pid", "host", "started", "command"}


def _refuse_foreign(lock: Path, what: str, why: str) -> NotALock:
    return NotALock(
        f"{what}: {str(lock)!r} {why}, not a heptstudy lock file, so it was neither followed nor "
        f"replaced and nothing ran. Move it out of the folder, or choose another folder"
    )


def _open_locked(lock: Path, what: str) -> tuple[int, dict] | dict:
    """``(fd, previous contents)`` with the flock held, or the holder's information. Anything but
    a single-link regular file, empty or a lock's, is refused, never followed or replaced."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:
            if lock.is_symlink():
                target = os.readlink(lock)
                raise _refuse_foreign(lock, what, f"is a symbolic link (to {target!r})") from None
            if lock.is_dir():
                raise _refuse_foreign(lock, what, "is a folder") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            link = f"is a hard link (one of {st.st_nlink} names of the same file)"
            kind = link if stat.S_ISREG(st.st_mode) else "is not a regular file"
            raise _refuse_foreign(lock, what, kind)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read_holder(fd)
            os.close(fd)
            return info
        except OSError:
            os.close(fd)
            raise
        # a holder that finished removed the file after we opened it: lock the new one instead
        try:
            same = st.st_ino == os.stat(lock, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        previous = _read_holder(fd)
        if previous and ("unreadable" in previous or not _LOCK_KEYS <= previous.keys()):
            os.close(fd)
            raise _refuse_foreign(lock, what, "holds other content")
        return fd, previous


@contextlib.contextmanager
def holding(folder: str | os.PathLike, what: str) -> Iterator[Path]:
    """Hold ``folder`` (created if missing) for the block, or raise :class:`FolderInUse`."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    got = _open_locked(lock, f"{what} {str(folder)!r}")
    if isinstance(got, dict):
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise FolderInUse(
            f"{what} {str(folder)!r} is in use by another run: {_describe(got)}. Wait for it "
            f"to finish or choose another folder; if that process is gone from its host, "
            f"remove {str(lock)!r}"
        )
    fd, previous = got
    if previous:
        alive = _pid_alive(previous.get("pid")) and previous.get("host") == socket.gethostname()
        state = "no longer holds it" if alive else "is no longer running"
        print(
            f"note: {what} {str(folder)!r}: taking over the lock left by {_describe(previous)},"
            f" which {state}",
            file=sys.stderr,
        )
    mine = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(a) for a in sys.argv[:1]] + sys.argv[1:])[:300],
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(mine) + "\n").encode())
    try:
        yield lock
    finally:
        # removed while still locked: a run waiting on this file sees another inode and retries
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)
        if created:  # a run refused before writing leaves no folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()


@contextlib.contextmanager
def holding_all(*folders: tuple[str | os.PathLike, str]) -> Iterator[None]:
    """:func:`holding` of every ``(folder, what)``; one inside an earlier one is covered by it."""
    with contextlib.ExitStack() as stack:
        held: list[Path] = []
        for folder, what in folders:
            path = Path(folder)
            if not any(path.is_relative_to(h) for h in held):
                stack.enter_context(holding(path, what))
                held.append(path)
        yield
