"""The README's "Measurement protocol" section, rendered from the one protocol text
(:data:`heptstudy.measure.report.PROTOCOL`, which every report carries).
``python -m heptstudy.measure.protocol_readme`` rewrites that part of the README; a test fails
when the two differ.
"""

from __future__ import annotations

from pathlib import Path

from heptstudy.atomic import atomic_write_text
from heptstudy.errors import HeptstudyError
from heptstudy.measure.report import PROTOCOL
from heptstudy.paths import base_dir

BEGIN = "<!-- protocol:begin (rendered from heptstudy.measure.report.PROTOCOL) -->"
END = "<!-- protocol:end -->"
README = base_dir() / "README.md"


def rendered_block() -> str:
    return f"{BEGIN}\n```text\n{PROTOCOL.rstrip()}\n```\n{END}"


def current_block(text: str, path: Path = README) -> str:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise HeptstudyError(
            f"{path} has no protocol section between the markers {BEGIN!r} and {END!r}; "
            "add both markers where the protocol belongs and run this again"
        )
    return text[start : stop + len(END)]


if __name__ == "__main__":
    text = README.read_text()
    old, new = current_block(text), rendered_block()
    if old != new:
        atomic_write_text(README, text.replace(old, new))
    print(f"{README}: protocol section {'already current' if old == new else 'rewritten'}")
