"""``python -m coalesce``: the same as the ``coalesce`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
