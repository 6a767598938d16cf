"""Output files checked before any work is done: the paths the commands and the bench suites
write (``--plot``, ``--json``, ``-o``), their missing folders made, a write that fails refused in
one line (``UsageError``: exit status 2 from the command line)."""

from __future__ import annotations

import os
from pathlib import Path

from apportion.errors import UsageError


def output_path(option: str, text: str, make_folders: bool = False) -> Path:
    """``text`` as a file the command can write, checked before any work is done
    (``make_folders``: its missing folders are made)."""
    if not text:
        raise UsageError(f"{option}: the path is empty")
    path = Path(text)
    try:
        if path.is_dir():
            raise UsageError(f"{option} {text!r} is a folder; give a file path in it")
        folder = path.parent
        if make_folders:
            make_folder(option, text, folder)
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise UsageError(f"{option} {text!r}: folder {str(folder)!r} {what}")
        if not os.access(folder, os.W_OK | os.X_OK) or (
                path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"{option} {text!r}: not writable")
    except OSError as e:  # a name too long, a folder that cannot be searched
        raise UsageError(f"{option} {text!r}: {e.strerror or e}") from None
    return path


def make_folder(option: str, text: str, folder: Path) -> None:
    """Make ``folder`` and its missing parents; a file in the way is one usage error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a folder goes
        blocking = next(p for p in (folder, *folder.parents) if p.exists() and not p.is_dir())
        raise UsageError(f"{option} {text!r}: {str(blocking)!r} is not a folder") from None
    except OSError as e:
        raise UsageError(f"{option} {text!r}: cannot make folder {str(folder)!r}: "
                         f"{e.strerror or e}") from None


def write_json(out: Path, text: str) -> None:
    """Write a benchmark's ``--json`` file, or one usage error line naming why not."""
    try:
        out.write_text(text)
    except OSError as e:
        raise UsageError(f"--json {str(out)!r}: cannot write: {e.strerror or e}") from None
