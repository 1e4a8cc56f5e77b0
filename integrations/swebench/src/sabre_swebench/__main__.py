"""``python -m sabre_swebench``: the ``sabre-swe`` command."""

import sys

from sabre_swebench.cli import main

sys.exit(main())
