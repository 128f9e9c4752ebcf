"""What the README and docs/ promise: the protocol every report carries, commands that run as
written from a fresh clone, links and folders that exist, the figures they quote from the
committed reference, and behaviour they describe that no other test pins down."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

from heptstudy.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FIRST_SCREEN = 40  # lines
# a command ends at the end of its inline code span, its line, or a shell comment
HEPTSTUDY = re.compile(r"\.venv/bin/heptstudy ([^`\n#]+)")
PAPERMILL = re.compile(r"\.venv/bin/papermill (\S+) \S+((?: -p \S+ \S+)*)")
MAKE = re.compile(r"(?:^|`)make ([a-z][a-z0-9-]*)", re.MULTILINE)
LINK = re.compile(r"\]\(([^)#\s]+)\)")
EXPERIMENT = re.compile(r"experiments/([A-Za-z0-9_.-]+)/")


def _text(path: Path) -> str:
    return path.read_text()


def _all(pattern: re.Pattern) -> list[tuple[str, re.Match]]:
    return [(doc.name, m) for doc in DOCUMENTS for m in pattern.finditer(_text(doc))]


def test_protocol_doc_is_the_reports_protocol():
    """docs/protocol.md's block is rendered from PROTOCOL, so the two cannot drift."""
    doc = runpy.run_path(str(ROOT / "scripts" / "protocol_doc.py"))
    assert doc["current_block"](doc["PROTOCOL_DOC"].read_text()) == doc["rendered_block"]()


def test_readme_is_a_front_page():
    lines = _text(README).splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move depth to docs/"
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "make study" in first and "make test" in first


@pytest.mark.parametrize(
    "where,command", [(n, m.group(1).strip()) for n, m in _all(HEPTSTUDY)], ids=str
)
def test_heptstudy_commands_parse(where, command):
    """Each command shown parses with the real command line (flags, choices, subcommands)."""
    try:
        build_parser().parse_args(shlex.split(command))
    except SystemExit as exit_:
        pytest.fail(f"{where}: `heptstudy {command}` does not parse (exit {exit_.code})")


def _notebook_parameters(notebook: Path) -> set[str]:
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    source = "".join(c.source for c in cells if "parameters" in c.metadata.get("tags", []))
    return set(re.findall(r"^(\w+)\s*=", source, re.MULTILINE))


def test_papermill_commands_name_notebook_parameters():
    commands = _all(PAPERMILL)
    assert commands, "no .venv/bin/papermill command found in README.md or docs/"
    for where, m in commands:
        notebook = ROOT / m.group(1)
        assert notebook.is_file(), f"{where}: {m.group(1)} does not exist"
        given = set(re.findall(r"-p (\S+)", m.group(2)))
        unknown = given - _notebook_parameters(notebook)
        assert not unknown, f"{where}: {m.group(0)!r}: {sorted(unknown)} not parameters"


def test_make_targets_exist():
    makefile = _text(ROOT / "Makefile")
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.MULTILINE))
    named = {(where, m.group(1)) for where, m in _all(MAKE)}
    assert {"study", "test"} <= {target for _, target in named}
    missing = sorted((where, t) for where, t in named if t not in targets)
    assert not missing, f"make targets not in the Makefile: {missing}"


def test_links_and_cited_experiments_exist():
    missing = []
    for doc in DOCUMENTS:
        text = _text(doc)
        for target in LINK.findall(text):
            if "://" not in target and not (doc.parent / target).exists():
                missing.append((doc.name, target))
        for folder in EXPERIMENT.findall(text):
            if folder not in ("local", "scratch") and not (ROOT / "experiments" / folder).is_dir():
                missing.append((doc.name, f"experiments/{folder}/"))
    assert not missing, f"cited but not in the tree: {missing}"


def test_a_checkpointed_layer_hashes_again_in_backward(tiny_overrides, monkeypatch):
    """docs/layout.md: each layer hashes inside its checkpointed region, so a training step
    under ``full`` hashes twice per backbone layer and once per layer without checkpointing."""
    import collections

    from heptstudy.config import load_config
    from heptstudy.model import build_model, example_batch
    from heptstudy.model.heptv2 import HEPTv2Layer

    hashed = collections.Counter()
    unwrapped_bucket_order = HEPTv2Layer.bucket_order

    def counting(layer, *args, **kwargs):
        hashed[id(layer)] += 1
        return unwrapped_bucket_order(layer, *args, **kwargs)

    monkeypatch.setattr(HEPTv2Layer, "bucket_order", counting)
    for plan, times in (("off", 1), ("full", 2)):
        cfg = load_config(
            overrides=[*tiny_overrides, f"model.heptv2.activation_checkpointing={plan}"]
        )
        model = build_model(cfg).train()
        batch = example_batch(cfg, 2, [40, 30], seed=1)
        hashed.clear()
        outputs = model(batch)
        sum(v.float().sum() for v in outputs.values()).backward()
        layers = [m for m in model.modules() if isinstance(m, HEPTv2Layer)]
        assert len(layers) == cfg.model.heptv2.num_convs
        assert [hashed[id(layer)] for layer in layers] == [times] * len(layers), plan


def _recorded_reference_minutes() -> int:
    """Minutes from the first run's Papermill start to the last run's end, as the committed
    reference's notebooks record them (its aggregate can be drawn again later)."""
    import json
    from datetime import datetime

    def papermill(path: Path) -> dict:
        return json.loads(path.read_text())["metadata"]["papermill"]

    folder = ROOT / "experiments" / "cpu_reference"
    runs = [papermill(p) for p in (folder / "notebooks").rglob("*.ipynb")]
    first = min(datetime.fromisoformat(r["start_time"]) for r in runs)
    last = max(datetime.fromisoformat(r["end_time"]) for r in runs)
    return round((last - first).total_seconds() / 60)


def test_make_reference_duration_is_the_one_its_notebooks_record():
    # The figure under test is the committed reference's own: the documents quote how long its
    # recorded run took, so a new measurement on this machine would test nothing they say.
    minutes = _recorded_reference_minutes()
    quoted = {}
    for doc in ("docs/development.md", "docs/results.md"):
        text = " ".join(_text(ROOT / doc).split())
        after = [text[m.end() : m.end() + 250] for m in re.finditer("make reference", text)]
        quoted[doc] = {int(n) for a in after for n in re.findall(r"(\d+) minutes", a)}
    readme = " ".join(_text(ROOT / "experiments" / "cpu_reference" / "README.md").split())
    quoted["experiments/cpu_reference/README.md"] = set(
        map(int, re.findall(r"(\d+) minutes", readme))
    )
    assert quoted == dict.fromkeys(quoted, {minutes}), f"recorded: {minutes} minutes"
