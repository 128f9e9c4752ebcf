#!/usr/bin/env bash
# Regenerate the stored memory models of configs/fit/ for the code as it is now, so that
# `heptstudy fit` uses them again (it refuses a stored model whose code fingerprint differs from
# the running code's, and says which part changed).
#
#   bash scripts/regenerate_fits.sh [DATA_DIR]
#       the two estimated models (h100 and lumi_mi250x recipes at 48 events per device): fake
#       steps of the current model on a generated 2,000-event set (seed 20261014, written to
#       DATA_DIR, default data/tfds_fit2000, if it is not there yet), each step's allocation
#       trace replayed through the caching-allocator simulator. No GPU needed; about 10-20
#       minutes on two cores.
#   bash scripts/regenerate_fits.sh --measured REPORTS_DIR [COMMIT]
#       the measured models, from GPU bench reports of the current code (heptstudy bench or
#       scripts/gpu/), fingerprinted with COMMIT's code (default: the commit the reports name).
#
# The estimated models are only as faithful as the fake step: regenerate them after the
# estimate's own code changes too (its part of the fingerprint).
set -euo pipefail
bin=${BIN:-.venv/bin}
export PYTHONPATH=${PYTHONPATH:-$PWD}

if [ "${1:-}" = "--measured" ]; then
  reports=${2:?give the folder of the GPU bench reports}
  commit=${3:-}
  "$bin/python" - "$reports" "$commit" <<'EOF'
import sys

from heptstudy.errors import HeptstudyError
from heptstudy.fitting.reports import save_measured_models

try:
    written, rejected = save_measured_models([sys.argv[1]], "configs/fit", sys.argv[2] or None)
except HeptstudyError as err:
    sys.exit(f"heptstudy: error: {err}")
for path in written:
    print(f"wrote {path}")
for r in rejected:
    print(f"not stored: {r}")
EOF
  exit 0
fi

data_dir=${1:-data/tfds_fit2000}
if [ ! -f "$data_dir/cld_edm_ttbar_hits/1/3.2.1/dataset_info.json" ]; then
  "$bin/heptstudy" data generate --data-dir "$data_dir" --events-train 2000 --events-test 64 \
    --seed 20261014
fi
for platform in h100 lumi_mi250x; do
  out="configs/fit/${platform}_hit_heptv2_b48_estimated.json"
  answer=$("$bin/heptstudy" fit --platform "$platform" --per-device-batch 48 \
    --data-dir "$data_dir" --estimate --save-model "$out")
  echo "${answer%%$'\n'*}"
  echo "wrote $out"
done
# the H100 recipe with fused attention: a copy of the profile with attention_backend fused (the
# recipe never overrides the platform's backend)
fused=$(mktemp --suffix=.yaml)
sed 's/^name: .*/name: h100_fused/; s/^attention_backend: .*/attention_backend: fused/' \
  configs/training/platforms/h100.yaml >"$fused"
out=configs/fit/h100_hit_heptv2_fused_b48_estimated.json
answer=$("$bin/heptstudy" fit --platform "$fused" --per-device-batch 48 --data-dir "$data_dir" \
  --estimate --save-model "$out")
rm -f "$fused"
echo "${answer%%$'\n'*}"
echo "wrote $out"
