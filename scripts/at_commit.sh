#!/usr/bin/env bash
# Run `heptstudy ARGS...` with the code of another commit: the commit is checked out in a git
# worktree in a temporary folder and run in this checkout's environment (nothing is installed
# into it). The package validates reports of the running code only (`heptstudy fit validate`
# skips the others and names this script); a report of other model or step code is validated by
# its commit's own code:
#
#   scripts/at_commit.sh COMMIT fit validate --reports DIR --data-dir DATA --out OUT
#
# It runs in the commit's checkout, so a relative path in ARGS names that commit's file (its
# reports, configs); the values of --out, --output and --data-dir are made absolute from the
# folder it was started in, so that what it writes outlives the worktree. Other paths of yours:
# give them absolute.
#
# Environment: PYTHON (default: this checkout's .venv/bin/python); PIP="name==version ..."
# packages the commit needs and the environment lacks, installed without dependencies into the
# temporary folder only (network needed).
#
# The H200's reports (experiments/h200_2026-11-30) measured commit 9a5529c, which has no
# `fit validate`. experiments/estimate_validation was made by 60f2c89, whose `fit validate
# --code 9a5529c` still ran an earlier commit's model and step under its own estimator (9a5529c's
# LAMB needs pytorch-optimizer). It is reproduced with (data: the current generator gives the
# same events; 1 to 2.5 minutes on two cores, by its README; checkpointed_b4 alone: 18 s):
#
#   .venv/bin/heptstudy data generate --data-dir data/h200 --events-train 144 --events-test 8 \
#       --seed 20261014
#   PIP=pytorch-optimizer==4.1.0 scripts/at_commit.sh 60f2c89 fit validate \
#       --reports experiments/h200_2026-11-30 --data-dir data/h200 --code 9a5529c --out OUT
#
# Likewise the README's CPU table (experiments/cpu_reference measured 436d7af, whose own `fit
# validate` is another tool): scripts/at_commit.sh 60f2c89 fit validate --reports
# experiments/cpu_reference --data-dir DATA --out OUT, DATA from `make study-data`.
#
# The estimator of the running code meets GPU evidence again once a GPU study of the current code
# is committed (scripts/gpu/): then `heptstudy fit validate --reports THAT_FOLDER` needs no script.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
if [ $# -lt 2 ]; then
  echo "usage: scripts/at_commit.sh COMMIT HEPTSTUDY_ARGS... (e.g. 60f2c89 fit validate ...)" >&2
  exit 2
fi
commit=$1
shift
if [[ $commit == -* ]] || ! sha=$(git -C "$root" rev-parse -q --verify "$commit^{commit}"); then
  echo "at_commit.sh: $commit is no commit of the repository at $root: give a commit it holds" \
    "(git log --oneline), fetching it first if it is elsewhere" >&2
  exit 2
fi
if ! [ -x "$python" ]; then
  echo "at_commit.sh: no Python at $python: run \`make install\`, or set PYTHON" >&2
  exit 2
fi

# absolute from here: what the command writes or reads of yours outlives the worktree
args=() pending=0
for arg in "$@"; do
  [ $pending = 1 ] && [[ $arg != /* ]] && arg=$PWD/$arg
  pending=0
  case $arg in
    --out | --output | --data-dir) pending=1 ;;
    --out=* | --output=* | --data-dir=*)
      [[ ${arg#*=} == /* ]] || arg=${arg%%=*}=$PWD/${arg#*=}
      ;;
  esac
  args+=("$arg")
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/heptstudy-at-${sha:0:9}.XXXXXX")
cleanup() {
  git -C "$root" worktree remove --force "$tmp/tree" 2>/dev/null || true
  rm -rf "$tmp"
  git -C "$root" worktree prune
}
trap cleanup EXIT
git -C "$root" worktree add -q --detach "$tmp/tree" "$sha"
path=$tmp/tree
if [ -n "${PIP:-}" ]; then
  # shellcheck disable=SC2086 # PIP is a list of requirements
  "$python" -m pip install -q --no-deps --target "$tmp/site" $PIP
  path=$tmp/site:$path
fi
cd "$tmp/tree"
export PYTHONPATH=$path
# the worktree's package, not one installed into the environment (an editable install of
# another checkout would otherwise shadow it)
"$python" -c 'import sys, heptstudy
if not heptstudy.__file__.startswith(sys.argv[1]):
    sys.exit(f"at_commit.sh: heptstudy imports from {heptstudy.__file__}, not the worktree")' \
  "$tmp/tree/"
echo "heptstudy $* at commit ${sha:0:9} (worktree $tmp/tree)" >&2
"$python" -c 'import sys
from heptstudy.cli import main
sys.argv[0] = "heptstudy"
sys.exit(main())' "${args[@]}"
