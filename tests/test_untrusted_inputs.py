"""Issue 34: nothing trusted that a file or a user's text says (cases 3, 4, 9, 12)."""

from __future__ import annotations

import pandas as pd
import pytest
from nbconvert.filters.markdown_mistune import markdown2html_mistune

from heptstudy import study

LINKS = [
    "[click](javascript:alert(2))",
    "![x](javascript:alert(3))",
    "[ref][1]\n\n[1]: javascript:alert(4)",
    "<javascript:alert(5)>",
]


ROW = {
    "name": "r",
    "kind": "memory",
    "status": "ok",
    "device": "cpu",
    "device_kind": "cpu",
    "dtype": "float32",
    "threads": 2,
    "torch": "2.13",
    "dataset": "ds",
    "data_dir": "/d",
    "synthetic": True,
    "counted_steps": 1,
    "warmup_steps": 1,
    "host": "h",
    "allocator": "glibc",
    "allocator_line": "platform",
    "round": 1,
    "load_average_1min": 0.5,
    "platform": "p",
}


@pytest.mark.parametrize("description", LINKS)
def test_a_markdown_link_in_a_description_never_becomes_a_link(description):
    df = pd.DataFrame([ROW])
    markdown = study.study_statement(df, description, [description])
    page = markdown2html_mistune(markdown)  # what nbconvert makes of the report's Markdown
    assert "<a " not in page and "<img" not in page and "href" not in page
    assert "javascript:alert" in page  # shown as text, not dropped


def test_a_project_link_still_renders():
    # the escaping is of user text only: Markdown the report writes itself keeps working
    page = markdown2html_mistune(study.esc("a(b)") + " [report](report.html)")
    assert '<a href="report.html">' in page and "a(b)" in page.replace("&#40;", "(").replace(
        "&#41;", ")"
    )
