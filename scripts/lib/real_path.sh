# Sourced by the launch wrappers (after setting PY). `real_path PATH WHAT` prints PATH as
# heptstudy will write it: made absolute from the working directory, links followed, then `..`
# (heptstudy.paths.real_path). A folder the shell reads back after heptstudy wrote it must be
# named so: the shell alone would look elsewhere when a folder on the way does not exist yet.
real_path() {
  "$PY" -c 'import sys
from heptstudy.errors import HeptstudyError
from heptstudy.paths import real_path
try:
    print(real_path(sys.argv[1], sys.argv[2]))
except HeptstudyError as err:
    sys.exit(f"heptstudy: error: {err}")' "$1" "$2"
}
