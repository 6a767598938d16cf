"""A spinner with what a long command is doing, on a terminal only.

``run --torch`` exports, plans and runs a model, and with ``--backend iree`` compiles it: half a
minute without a word. On a terminal ``progress`` shows the step under way (rich's status line,
erased when the step ends); into a pipe or a file it writes nothing, so piped output stays the
report alone.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rich.console import Console


def progress(console: Console, what: str) -> AbstractContextManager[Any]:
    """A context manager showing ``what`` with a spinner while it runs, on a terminal only."""
    if not console.is_terminal:
        return nullcontext()
    return console.status(what, spinner="dots")
