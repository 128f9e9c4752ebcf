"""The kernels a study starts: local, over Unix sockets.

Papermill's kernels talk to their client over ZeroMQ. jupyter_client's default transport is TCP
on localhost without encryption, and ipykernel then warns, into every executed notebook's log,
that code and outputs travel in plain text. A study's kernels never leave the machine, so they
use the IPC transport instead: Unix sockets in the user's Jupyter runtime folder (mode 0700),
which only the user can reach, and there is nothing to warn about. The sockets are removed
with the kernel.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir


class LocalKernelManager(KernelManager):
    """A :class:`~jupyter_client.manager.KernelManager` on the IPC transport, its sockets in
    the Jupyter runtime folder (not in the working directory, the repository)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("transport", "ipc")
        if kwargs["transport"] == "ipc" and not kwargs.get("ip"):
            runtime = Path(jupyter_runtime_dir())
            runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
            # socket paths are limited to about 100 bytes: a short name
            kwargs["ip"] = str(runtime / f"hs-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        super().__init__(**kwargs)


def execute_notebook(input_path: str | os.PathLike, output_path: str | os.PathLike, **kwargs):
    """:func:`papermill.execute_notebook` with its kernel started by
    :class:`LocalKernelManager`."""
    import papermill as pm

    kwargs.setdefault("kernel_manager_class", LocalKernelManager)
    return pm.execute_notebook(str(input_path), str(output_path), **kwargs)
