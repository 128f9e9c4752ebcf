"""``python -m heptstudy ...``: the ``heptstudy`` command."""

import sys

try:
    from heptstudy.cli import main
except KeyboardInterrupt:  # Ctrl-C while the package loads: nothing has started yet
    print("heptstudy: interrupted: nothing had started", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
