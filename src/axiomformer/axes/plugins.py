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

A broken plug-in never stops axiomformer: an entry point whose module fails to import, whose attribute is missing,
whose object is not a ``Choice`` (or is misnamed, or has fields of the wrong type: text that is not a string, an
``impl`` that cannot be called, traits that are not a set of names, a trait without the ``extra`` entries it
promises: :data:`TRAIT_EXTRAS`), whose factory raises, or whose registration fails (an undeclared trait, a malformed
``<axis>.<choice>`` name, a choice name that is not an identifier) is skipped with one :class:`PluginWarning` naming the entry point and
its distribution (as httpie and llm do with a crashing plug-in). So is a clash: a plug-in that takes the name of a
built-in choice is skipped (the built-in is kept), and a name that two distributions register is kept by neither,
since which one a spec means is undecidable (the warning names both). One distribution reachable twice on
``sys.path`` is one plug-in, not a clash.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any, NoReturn

from axiomformer.axes.registry import Choice, Registry

GROUP = "axiomformer.choices"
"""The entry-point group."""


class PluginWarning(UserWarning):
    """A plug-in choice that could not be loaded and was skipped (its entry point and distribution named)."""


class BrokenPlugin(Exception):
    """One plug-in is unusable (the message says why); it is skipped with a warning (also of ``engines/plugins.py``)."""


class PluginClash(BrokenPlugin):
    """Two distributions register one name: neither is kept, nor any later registrant of that name."""


def distribution_name(entry: metadata.EntryPoint) -> str:
    """The distribution that declares ``entry`` (its top-level module when the metadata gives no name)."""
    dist = getattr(entry, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return name if isinstance(name, str) and name else entry.value.split(":")[0].split(".")[0]


def unique_entries(entries: list[metadata.EntryPoint]) -> list[tuple[metadata.EntryPoint, str]]:
    """``(entry, distribution)`` by entry name, each once: one distribution found twice on ``sys.path`` declares the
    same entry point twice, which is not a clash."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for entry in sorted(entries, key=lambda e: e.name):
        package = distribution_name(entry)
        if (package, entry.name, entry.value) not in seen:
            seen.add((package, entry.name, entry.value))
            out.append((entry, package))
    return out


def _load(entry: metadata.EntryPoint, package: str, axis: str, name: str) -> Choice:
    try:
        loaded: Any = entry.load()
        choice = loaded if isinstance(loaded, Choice) else (loaded() if callable(loaded) else loaded)
        return _checked(choice, axis, name)
    except BrokenPlugin:
        raise
    # Anything the plug-in's own code raises (SystemExit or a BaseException of its own too), also from a property
    # of its Choice read by the checks; not KeyboardInterrupt.
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        raise BrokenPlugin(f"loading it raised {type(err).__name__}: {err}") from err


def _checked(choice: Any, axis: str, name: str) -> Choice:
    if not isinstance(choice, Choice):
        raise BrokenPlugin(f"it gives {type(choice).__name__}, not an axiomformer.axes.registry.Choice")
    if choice.name != name:
        raise BrokenPlugin(f"it names the {axis} choice {name!r}, but its Choice is named {choice.name!r}")
    wrong = _wrong_fields(choice)
    if wrong:
        raise BrokenPlugin(f"its Choice has {'; '.join(wrong)}")
    missing = missing_extras(axis, choice)
    if missing:
        raise BrokenPlugin(f"its traits promise extra entries it lacks ({', '.join(missing)})")
    return choice


TRAIT_EXTRAS: dict[tuple[str | None, str], tuple[str, ...]] = {
    ("normalizer", "parametric"): ("parameters", "params"),
    ("normalizer", "configured"): ("options", "defaults", "fields"),
    ("normalizer", "closed_grad"): ("impl_", "grad_"),
    ("normalizer", "closed_vjp"): ("vjp",),
    ("normalizer", "entmax"): ("alpha",),
    ("scale", "constant"): ("value",),
    ("scale", "parametric"): ("parameters",),
    ("score", "pairwise"): ("pair_width",),
    ("score", "dot_form"): ("dot_form",),
    ("contribution", "pairwise"): ("pair_width",),
    (None, "starts_standard"): ("move",),
}
"""The ``extra`` entries a trait promises, read by name where the trait is acted on (``Plan``, the engines, the
axes' modules); a choice with the trait and without them would fail at its first forward. An axis of ``None``: on
every axis (``starts_standard``'s ``move``, read by ``audit/adapters.py``). ``tests/test_plugins.py`` checks the built-in choices
against this table, so it cannot drift from what the code reads."""

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A choice name: an identifier, so that it reads back from a relax string (``normalizer=relu2,score=dot``)."""


LATER_CLASH = "more than one distribution registers this name, so none is kept"
"""Why a third (or later) registrant of a clashed name is skipped too."""


def refuse_clash(kind: str, name: str, first: str, package: str, unregister: Callable[[str], Any] | None) -> NoReturn:
    """Skip ``package``'s plug-in ``name``, which ``first`` registered already (of both plug-in groups).

    A built-in (``first == "axiomformer"``) is kept: :class:`BrokenPlugin`. Two distributions: which one a spec
    means is undecidable, so the first is taken back too (``unregister(name)``, where given): :class:`PluginClash`.
    """
    if first == "axiomformer":
        raise BrokenPlugin(f"{name!r} is a built-in {kind} of axiomformer, which is kept")
    if unregister is not None:
        unregister(name)
    raise PluginClash(
        f"{kind} {name!r} is registered twice: by {first} and by {package}; neither is kept (naming it would be "
        "ambiguous)"
    )


def missing_extras(axis: str, choice: Choice) -> list[str]:
    """``"trait: key"`` for each ``extra`` key one of the choice's traits promises (:data:`TRAIT_EXTRAS`) that it
    lacks."""
    wanted = {trait: keys for (on, trait), keys in TRAIT_EXTRAS.items() if on in (axis, None)}
    return [
        f"{trait}: {key}" for trait in sorted(choice.traits) for key in wanted.get(trait, ()) if key not in choice.extra
    ]


def _wrong_fields(choice: Choice) -> list[str]:
    """What in ``choice`` would fail later, at a forward or in a table, rather than now (a dataclass checks no
    types): the text fields as strings, ``impl`` callable, ``traits`` a set of strings, ``extra`` a dict."""
    wrong = [
        f"{field} of type {type(getattr(choice, field)).__name__} (expected str)"
        for field in ("formula", "source", "relaxes")
        if not isinstance(getattr(choice, field), str)
    ]
    if choice.impl is not None and not callable(choice.impl):
        wrong.append(f"impl of type {type(choice.impl).__name__} (expected a function or a module factory)")
    traits = choice.traits
    if isinstance(traits, str) or not isinstance(traits, (set, frozenset, tuple, list)):
        wrong.append(f"traits of type {type(traits).__name__} (expected a frozenset of trait names)")
    elif not all(isinstance(t, str) for t in traits):
        wrong.append("traits that are not all strings")
    if not isinstance(choice.extra, dict):
        wrong.append(f"extra of type {type(choice.extra).__name__} (expected a dict)")
    return wrong


def _add(registries: dict[str, Registry], entry: metadata.EntryPoint, package: str) -> None:
    """Load and register one entry point; raises :class:`BrokenPlugin` (skip it; :class:`PluginClash` for a name
    another distribution registered)."""
    axis, _, name = entry.name.partition(".")
    if axis not in registries or not name:
        raise BrokenPlugin(f"expected a name '<axis>.<choice>' with an axis of: {', '.join(registries)}")
    if not NAME.fullmatch(name):
        raise BrokenPlugin(
            f"the choice name {name!r} is not an identifier (letters, digits, _), so no spec could name it"
        )
    if name in registries[axis]:
        refuse_clash(f"{axis} choice", name, registries[axis].origin(name), package, registries[axis].unregister)
    choice = _load(entry, package, axis, name)
    try:
        registries[axis].register(choice, origin=package)
    # An undeclared trait (the name was checked free above), or anything a registry subclass raises.
    except Exception as err:
        raise BrokenPlugin(f"registering it raised {type(err).__name__}: {err}") from err


def load_choices(registries: dict[str, Registry], entries: list[metadata.EntryPoint] | None = None) -> list[str]:
    """Register every choice of the entry-point group in its axis's registry; returns ``["axis.name", ...]``.

    A plug-in that cannot be loaded is skipped with one :class:`PluginWarning` naming the entry point, its target and
    its distribution (see the module docstring); the same entry point of the same distribution seen twice counts once.

    Args:
        registries: axis name -> registry (``axiomformer.spec.REGISTRIES``).
        entries: the entry points (default: the installed ones of :data:`GROUP`).

    A name that axiomformer registers already keeps the built-in choice; a name two distributions register is kept by
    neither (both named in the warning).
    """
    entries = list(metadata.entry_points(group=GROUP)) if entries is None else entries
    added: list[str] = []
    clashed: set[str] = set()
    for entry, package in unique_entries(entries):
        try:
            if entry.name in clashed:
                raise BrokenPlugin(LATER_CLASH)
            _add(registries, entry, package)
        except BrokenPlugin as why:
            if isinstance(why, PluginClash):
                clashed.add(entry.name)
                if entry.name in added:
                    added.remove(entry.name)
            warnings.warn(
                f"axiomformer: skipped the plug-in choice {entry.name!r} ({entry.value}) of the distribution "
                f"{package} in the entry-point group {GROUP}: {why}",
                PluginWarning,
                stacklevel=2,
            )
            continue
        added.append(entry.name)
    return added
