"""A plain-text table of what scripts/gpu/run.sh measured: every report under OUT (study/,
fused/, expandable/) and the fused kernel check. Reads the JSON files as written, so that it
also lists reports of failed runs.

    python3 scripts/gpu/summarize.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FOLDERS = ("study", "fused", "expandable")


def _num(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def report_rows(out: Path) -> list[str]:
    lines = [
        f"{'run':<38} {'status':<7} {'step s':>7} {'alloc MiB':>10} {'resv MiB':>10} "
        f"{'attention':<16} {'compiles':>8}  error"
    ]
    for folder in FOLDERS:
        for path in sorted((out / folder).glob("*.json")):
            try:
                r = json.loads(path.read_text())
            except (OSError, ValueError) as err:
                lines.append(f"{folder}/{path.stem:<31} unreadable: {err}")
                continue
            s = r.get("summary") or {}
            att = (r.get("environment") or {}).get("attention") or {}
            error = (r.get("error") or (r.get("oom") or {}).get("message") or "")[:80]
            lines.append(
                f"{folder + '/' + path.stem:<38} {r.get('status', '?'):<7} "
                f"{_num(s.get('mean_step_time_s'), '7.3f')} "
                f"{_num(s.get('max_peak_allocated_mib'), '10,.0f')} "
                f"{_num(s.get('max_peak_reserved_mib'), '10,.0f')} "
                f"{att.get('backend_used', '-'):<16} {_num(att.get('fused_compiles'), '8d')}  "
                f"{error}"
            )
    return lines


def check_rows(out: Path) -> list[str]:
    path = out / "fused_check.json"
    if not path.exists():
        return ["fused_check.json: none"]
    sections = json.loads(path.read_text()).get("sections", {})
    lines = []
    for name, sec in sections.items():
        if not sec.get("ok"):
            lines.append(f"{name}: FAILED {sec.get('error', '')[:200]}")
        elif name.startswith("kernel"):
            calls = sec["calls"]
            later = [c["seconds"] for c in calls[1:]]
            lines.append(
                f"{name}: {len(calls)} lengths, {sec['status']['fused_compiles']} compiles, "
                f"first call {calls[0]['seconds']:.2f} s, later calls "
                f"{min(later):.4f}-{max(later):.4f} s, peak up to "
                f"{max(c['peak_allocated_mib'] or 0 for c in calls):,.0f} MiB"
            )
        elif name.startswith("parity"):
            lines.append(
                f"{name}: max |out diff| {sec['max_abs_output_difference']}, "
                f"max grad rel L2 {sec['max_rel_l2_gradient_difference']}"
            )
        elif name.startswith("backbone"):
            lines.append(
                f"{name}: {sec['hits']:,} hits, median {sec['median_s']:.4f} s "
                f"({', '.join(f'{t:.4f}' for t in sec['times_s'])}), peak "
                f"{sec['peak_allocated_mib']:,.0f} MiB"
            )
    return lines


def main(out: str) -> int:
    root = Path(out)
    print("\n".join(check_rows(root)))
    print()
    print("\n".join(report_rows(root)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
