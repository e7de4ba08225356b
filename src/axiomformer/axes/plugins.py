"""Choices from other packages: the entry-point group ``axiomformer.choices``.

A package adds a choice to any axis by declaring one entry point per choice, named ``<axis>.<choice name>`` and
pointing at a :class:`~axiomformer.axes.registry.Choice` (or a function of no arguments returning one), e.g. in its
``pyproject.toml``::

    [project.entry-points."axiomformer.choices"]
    "normalizer.relu2" = "my_package.choices:RELU2"

The choices are loaded once, when ``axiomformer.spec`` is imported, before the axes' choice lists (``AXES``) are read,
so a registered choice is a valid spec field value everywhere: ``axiomformer spec``, ``audit``, ``bench``,
``train --spec`` and study configs. Its traits tell the engines what they may rely on (each axis module lists its
traits); a choice with none runs on the reference and chunked engines. The module that defines it should import only
``axiomformer.axes.registry`` (and torch): ``axiomformer.spec`` is still being imported.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from axiomformer.axes.registry import Choice, Registry
from axiomformer.errors import UserInputError

GROUP = "axiomformer.choices"
"""The entry-point group."""


def _package(entry: metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return dist.name if dist is not None else entry.value.split(":")[0].split(".")[0]


def _load(entry: metadata.EntryPoint, package: str, axis: str, name: str) -> Choice:
    loaded: Any = entry.load()
    choice = loaded if isinstance(loaded, Choice) else (loaded() if callable(loaded) else loaded)
    if not isinstance(choice, Choice):
        raise UserInputError(
            f"entry point {entry.name!r} of {package} ({entry.value}) gives "
            f"{type(choice).__name__}, not an axiomformer.axes.registry.Choice"
        )
    if choice.name != name:
        raise UserInputError(
            f"entry point {entry.name!r} of {package} names the {axis} choice {name!r}, but its Choice "
            f"is named {choice.name!r}"
        )
    return choice


def load_choices(registries: dict[str, Registry], entries: list[metadata.EntryPoint] | None = None) -> list[str]:
    """Register every choice of the entry-point group in its axis's registry; returns ``["axis.name", ...]``.

    Args:
        registries: axis name -> registry (``axiomformer.spec.REGISTRIES``).
        entries: the entry points (default: the installed ones of :data:`GROUP`).

    Raises:
        UserInputError (a ValueError): a malformed entry-point name or unknown axis (naming the axes), an object that is not a
            ``Choice``, or a name registered twice (naming both packages, or axiomformer and the package).
    """
    entries = list(metadata.entry_points(group=GROUP)) if entries is None else entries
    added = []
    for entry in sorted(entries, key=lambda e: e.name):
        package = _package(entry)
        axis, _, name = entry.name.partition(".")
        if axis not in registries or not name:
            raise UserInputError(
                f"entry point {entry.name!r} of {package} in {GROUP}: expected '<axis>.<choice>' with "
                f"an axis of: {', '.join(registries)}"
            )
        if name in registries[axis]:
            raise UserInputError(
                f"{axis} choice {name!r} is registered twice: by {registries[axis].origin(name)} and by {package}"
            )
        registries[axis].register(_load(entry, package, axis, name), origin=package)
        added.append(entry.name)
    return added
