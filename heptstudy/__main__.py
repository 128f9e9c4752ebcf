"""``python -m heptstudy ...``: the ``heptstudy`` command."""

import sys

from heptstudy.cli import main

sys.exit(main())
