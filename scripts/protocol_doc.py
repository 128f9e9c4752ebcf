"""``docs/protocol.md``'s protocol block, rendered from the one protocol text
(:data:`heptstudy.measure.report.PROTOCOL`, which every report carries).

    python scripts/protocol_doc.py

rewrites that block; tests/test_docs.py fails when the two differ.
"""

from __future__ import annotations

from pathlib import Path

from heptstudy.atomic import atomic_write_text
from heptstudy.errors import HeptstudyError
from heptstudy.measure.report import PROTOCOL
from heptstudy.paths import base_dir

BEGIN = "<!-- protocol:begin (rendered from heptstudy.measure.report.PROTOCOL) -->"
END = "<!-- protocol:end -->"
PROTOCOL_DOC = base_dir() / "docs" / "protocol.md"


def rendered_block() -> str:
    return f"{BEGIN}\n```text\n{PROTOCOL.rstrip()}\n```\n{END}"


def current_block(text: str, path: Path = PROTOCOL_DOC) -> str:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise HeptstudyError(
            f"{path} has no protocol block between the markers {BEGIN!r} and {END!r}; "
            "add both markers where the protocol belongs and run "
            "`python scripts/protocol_doc.py` again"
        )
    return text[start : stop + len(END)]


if __name__ == "__main__":
    text = PROTOCOL_DOC.read_text()
    old, new = current_block(text), rendered_block()
    if old != new:
        atomic_write_text(PROTOCOL_DOC, text.replace(old, new))
    print(f"{PROTOCOL_DOC}: protocol block {'already current' if old == new else 'rewritten'}")
