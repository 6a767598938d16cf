"""Python child processes started isolated from the current directory.

A Python started with ``-m``, ``-c`` or a script puts the current directory (or the script's
folder) first on ``sys.path``, so a ``numpy.py``, ``json.py``, ``pickle.py`` or ``apportion/``
where the user runs apportion would be imported by apportion's own children in place of the
real one, and run. ``-P`` (Python 3.11's ``safe_path``) leaves it off: the child finds apportion
and its dependencies where they are installed (site-packages, an editable install's path hook,
``PYTHONPATH``), as the ``apportion`` command itself does.

>>> python_command("-m", "apportion.backends.openmp.worker")[1:]
['-P', '-m', 'apportion.backends.openmp.worker']
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: the environment variable that sets ``-P`` for every Python started with it
SAFE_PATH = "PYTHONSAFEPATH"


def python_command(*args: str) -> list[str]:
    """The command line of a child running this interpreter on ``args``, without the current
    directory (or a script's folder) on its ``sys.path``."""
    return [sys.executable, "-P", *args]


@contextmanager
def safe_path_children() -> Iterator[None]:
    """``PYTHONSAFEPATH=1`` in this process's environment while the block runs, then as it was:
    for Python children whose command line apportion does not write (multiprocessing's
    ``spawn``, which runs ``python -c`` and imports ``multiprocessing`` and ``pickle`` before it
    takes this process's ``sys.path``)."""
    before = os.environ.get(SAFE_PATH)
    os.environ[SAFE_PATH] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SAFE_PATH, None)
        else:
            os.environ[SAFE_PATH] = before
