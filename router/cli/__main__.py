"""``python -m router.cli ...``: the same command as the ``nsjms`` console script (:func:`router.cli.main`)."""

from __future__ import annotations

import sys

from router.cli import main

if __name__ == "__main__":
    sys.exit(main())
