"""The one exception type for bad input from the user: a file, folder, config, spec or target that is not what a
command expects.

Library code raises :class:`UserInputError` (a ``ValueError``) with a message that names the thing and what was
expected; the command line (``axiomformer.cli``) prints that message as one line and exits with code 2, with no
traceback. Raising it must leave every file as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class UserInputError(ValueError):
    """Bad input from the user; the message names the input and what was expected."""


def expect_folder(path: Path | None, option: str = "--out") -> Path | None:
    """Check, before any work, that ``path`` (a pathlib.Path or None) can be an output folder: it is missing or a
    folder, and no parent is a file. Returns ``path``.

    Raises:
        UserInputError: naming ``option`` and the file in the way.
    """
    if path is not None:
        for part in (path, *path.parents):
            if part.exists() and not part.is_dir():
                raise UserInputError(f"{option} {path}: {part} is a file; expected a folder")
    return path


def expect_writable_folder(path: Path | None, option: str = "--out") -> Path | None:
    """:func:`expect_folder`, and that files can be written there, before any work (a run that computes for an hour
    and then cannot save is the worst way to learn it). The probe is a real write, so a read-only file system and
    a folder the user may not write (also as root without the override capabilities) are both seen; it creates
    and removes one temporary entry in ``path``, or in its nearest existing parent when ``path`` does not exist yet
    (so ``path`` itself is not created). Returns ``path``.

    Raises:
        UserInputError: naming ``option``, the folder and the operating system's reason.
    """
    if path is None:
        return None
    expect_folder(path, option)
    base = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    try:
        if base == path:
            handle, probe = tempfile.mkstemp(dir=base, prefix=".axiomformer-write-probe-")
            os.close(handle)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=base, prefix=".axiomformer-write-probe-"))
    except OSError as err:
        raise UserInputError(f"{option} {path}: cannot write in {base} ({err.strerror or err})") from None
    return path


def expect_file_path(path: Path | None, option: str) -> Path | None:
    """Check, before any work, that ``path`` (a pathlib.Path or None) can be written as a file: not a folder, and
    no parent is a file. Returns ``path``.

    Raises:
        UserInputError: naming ``option`` and what is in the way.
    """
    if path is not None:
        if path.is_dir():
            raise UserInputError(f"{option} {path} is a folder; expected a file name")
        expect_folder(path.parent, option)
    return path
