"""The exceptions coalesce raises, on their own: ``from coalesce.exceptions import ...``.

The same classes as ``coalesce.CoalesceError`` and its subclasses at the top level
(the tree is drawn in ``coalesce._exceptions``). Code that stands apart from the rest of
coalesce takes them from here, importing nothing else of it: the simulated provider,
:mod:`coalesce.testing`, does (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

from ._exceptions import *  # noqa: F403  # the whole hierarchy, as its __all__ names it
from ._exceptions import __all__ as __all__
