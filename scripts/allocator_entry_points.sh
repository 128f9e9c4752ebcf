#!/usr/bin/env bash
# The same measurement from the three entry points (issue 23): the headline papermill command,
# `heptstudy bench` and a one-run `heptstudy study run`, at batch 4 (full checkpointing unless
# CHECKPOINTING says otherwise) on the same events, each started from a shell without any allocator variable, so that only the
# measurement's own mallopt sets the allocator. Then summarises each report's allocator
# settings and minor page faults per counted step (summary.tsv).
#   bash scripts/allocator_entry_points.sh [DATA_DIR] [OUT_DIR] [PASSES] [CHECKPOINTING]
# PASSES: both (default; about 10 minutes on two idle cores, full-size model) or timing (the
# page faults are counted in the timed pass; about half the time).
set -euo pipefail
data_dir=${1:-data/tfds}
out=${2:-experiments/allocator_entry_points}
passes=${3:-both}
checkpointing=${4:-full}
# the headline command's own spelling of full checkpointing
notebook_value=$([ "$checkpointing" = full ] && echo true || echo "$checkpointing")
bin=${VENV:-.venv}/bin
mkdir -p "$out"
clean=(env -u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_ -u MALLOC_TOP_PAD_ -u MALLOC_ARENA_MAX)
"${clean[@]}" "$bin/papermill" notebooks/memory.ipynb "$out/papermill.ipynb" --log-level WARNING \
  -p batch_size 4 -p checkpointing "$notebook_value" -p data_dir "$data_dir" -p passes "$passes" -p output "$out/papermill.json"
"${clean[@]}" "$bin/heptstudy" bench --batch-size 4 --checkpointing "$checkpointing" --data-dir "$data_dir" \
  --passes "$passes" --no-progress --output "$out/bench.json"
study=$(mktemp -d)
printf 'name: allocator_entry_points\ndescription: one run\ndefaults: {data_dir: %s}\nruns:\n  - {batch_size: 4, checkpointing: %s, passes: %s}\n' \
  "$data_dir" "$checkpointing" "$passes" > "$study/matrix.yaml"
"${clean[@]}" "$bin/heptstudy" study run --matrix "$study/matrix.yaml" --out "$study/out" \
  --no-aggregate --no-progress
cp "$study/out/"*_b4.json "$out/study_run.json"
rm -rf "$study"
"$bin/python" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = ["entry point\treport name\tallocator\tsettings\tapplied (mallopt)\tminor faults per counted step\tmean\tmean step s"]
for name in ("papermill", "bench", "study_run"):
    r = json.loads((out / f"{name}.json").read_text())
    env, counted = r["environment"], [s for s in r["steps"] if s["counted"]]
    faults = [s["minor_page_faults"] for s in counted]
    rows.append("\t".join(map(str, [
        name, r["name"], env["allocator"], json.dumps(env["allocator_settings"], sort_keys=True),
        json.dumps(env.get("allocator_applied"), sort_keys=True),
        " / ".join(map(str, faults)), round(sum(faults) / len(faults)), round(r["summary"]["mean_step_time_s"], 2)])))
(out / "summary.tsv").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
