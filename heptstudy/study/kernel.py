"""The kernels a study starts: local, over Unix sockets.

jupyter_client's default transport is unencrypted TCP on localhost, and ipykernel then warns, into
every executed notebook's log, that code and outputs travel in plain text. A study's kernels never
leave the machine, so they use Unix sockets in the user's Jupyter runtime folder (mode 0700)
instead: nothing to warn about, and nothing in the working directory.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir


class LocalKernelManager(KernelManager):
    def __init__(self, **kwargs: Any) -> None:
        runtime = Path(jupyter_runtime_dir())
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        # socket paths are limited to about 100 bytes: a short name
        ip = str(runtime / f"hs-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        super().__init__(transport="ipc", ip=ip, **kwargs)


def execute_notebook(input_path: str | os.PathLike, output_path: str | os.PathLike, **kwargs):
    """:func:`papermill.execute_notebook` with its kernel on Unix sockets."""
    import papermill as pm

    kwargs.setdefault("kernel_manager_class", LocalKernelManager)
    return pm.execute_notebook(str(input_path), str(output_path), **kwargs)
