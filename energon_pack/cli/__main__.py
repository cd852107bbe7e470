"""``python -m energon_pack.cli``: the ``energon-pack`` command."""

import sys

from energon_pack.cli import main

sys.exit(main())
