"""The one exception type for bad input from the user: a file, folder, config, spec or target that is not what a
command expects.

Library code raises :class:`UserInputError` (a ``ValueError``) with a message that names the thing and what was
expected; the command line (``axiomformer.cli``) prints that message as one line and exits with code 2, with no
traceback. Raising it must leave every file as it was.
"""

from __future__ import annotations

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
