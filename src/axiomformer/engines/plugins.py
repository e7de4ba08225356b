"""Engines from other packages: the entry-point group ``axiomformer.engines``.

A package adds an engine by declaring one entry point per engine, named after the engine and pointing at an object
that follows the protocol of ``engines/base.py`` (an instance, a class, or a function of no arguments returning
one), e.g. in its ``pyproject.toml``::

    [project.entry-points."axiomformer.engines"]
    my_engine = "mydistribution_name.engine:MyEngine"

The engines are loaded once, when ``axiomformer.engines`` is imported, after the built-in ones, and registered with
:func:`~axiomformer.engines.router.register_engine`: tried before the engine named by their ``before`` attribute
(default ``"reference"``, i.e. after every built-in fast engine). The router asks them like every engine (their
``computes`` over the traits of a plan's choices, then ``accepts``), ``Attention(spec, engine="my_engine")`` forces
one, and the generated equivalence matrix (``tests/test_engine_matrix.py``) checks every cell they accept against
the reference engine. The module that defines one should import from ``axiomformer.engines.base``, ``.plan`` and
``.problem`` only: ``axiomformer.engines`` itself is still being imported.

A broken plug-in never stops axiomformer, as for choices (``axes/plugins.py``): an entry point whose module fails to
import, whose attribute is missing, whose factory raises, whose object lacks the protocol's attributes (or is
misnamed, or an attribute raises when read, or ``computes`` is not a ``Computes``) is skipped with one :class:`~axiomformer.axes.plugins.PluginWarning` naming the entry point and its
distribution. So is a clash: a plug-in named like a built-in engine is skipped (the built-in is kept), and a name
that two distributions register is kept by neither (the warning names both).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any

from axiomformer.axes.plugins import LATER_CLASH, BrokenPlugin, PluginClash, PluginWarning, refuse_clash, unique_entries
from axiomformer.engines.base import EVERY_CHOICE, Computes

GROUP = "axiomformer.engines"
"""The entry-point group."""

PROTOCOL = ("name", "returns_weights", "double_backward", "accepts", "twice_differentiable", "__call__")
"""The attributes an engine must have (``engines/base.py``); ``EngineBase`` gives all but ``__call__``'s body."""


def _load(entry: metadata.EntryPoint) -> Any:
    try:
        loaded: Any = entry.load()
        # A class or a factory is called; an instance (it has ``accepts``) is the engine.
        engine = (
            loaded() if isinstance(loaded, type) or (callable(loaded) and not hasattr(loaded, "accepts")) else loaded
        )
    # Anything the plug-in's own code raises (SystemExit or a BaseException of its own too); not KeyboardInterrupt.
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        raise BrokenPlugin(f"loading it raised {type(err).__name__}: {err}") from err
    try:
        _check_protocol(engine, entry.name)
    # A property of the plug-in's engine that raises when read is the plug-in's fault too.
    except BaseException as err:
        if isinstance(err, (BrokenPlugin, KeyboardInterrupt)):
            raise
        raise BrokenPlugin(f"reading its attributes raised {type(err).__name__}: {err}") from err
    return engine


def _check_protocol(engine: Any, name: str) -> None:
    """Raise :class:`BrokenPlugin` unless ``engine`` has the protocol's attributes, of usable types, and ``name``."""
    missing = [attr for attr in PROTOCOL if not hasattr(engine, attr)]
    if missing:
        raise BrokenPlugin(f"it gives {type(engine).__name__}, which lacks {', '.join(missing)} (see engines/base.py)")
    if engine.name != name:
        raise BrokenPlugin(f"its entry point names the engine {name!r}, but the engine is named {engine.name!r}")
    not_callable = [
        attr for attr in ("accepts", "twice_differentiable", "__call__") if not callable(getattr(engine, attr))
    ]
    if not_callable:
        raise BrokenPlugin(f"its {', '.join(not_callable)} cannot be called")
    computes = getattr(engine, "computes", EVERY_CHOICE)
    if not isinstance(computes, Computes):
        raise BrokenPlugin(f"its computes is a {type(computes).__name__}, not an axiomformer.engines.base.Computes")
    before = getattr(engine, "before", "reference")
    if before is not None and not isinstance(before, str):
        raise BrokenPlugin(f"its before is a {type(before).__name__}, not an engine name")


def load_engines(
    register: Callable[..., None],
    registered: dict[str, str],
    entries: list[metadata.EntryPoint] | None = None,
    unregister: Callable[[str], None] | None = None,
) -> list[str]:
    """Register every engine of the entry-point group; returns their names.

    An engine that cannot be loaded is skipped with one :class:`~axiomformer.axes.plugins.PluginWarning` naming the
    entry point, its target and its distribution; the same entry point of the same distribution seen twice counts once.

    Args:
        register: ``register_engine(engine, before=...)`` of the router.
        registered: engine name -> who registered it (``"axiomformer"`` or a distribution); updated.
        entries: the entry points (default: the installed ones of :data:`GROUP`).

        unregister: ``unregister_engine(name)`` of the router, to take back the first of two distributions that
            register one name (without it the first stays).

    A name that axiomformer registers already keeps the built-in engine; a name two distributions register is kept
    by neither (both named in the warning).
    """
    entries = list(metadata.entry_points(group=GROUP)) if entries is None else entries
    added: list[str] = []
    clashed: set[str] = set()
    for entry, package in unique_entries(entries):
        try:
            engine = _admitted(entry, package, registered, clashed, unregister)
        except BrokenPlugin as why:
            if isinstance(why, PluginClash):
                clashed.add(entry.name)
                if entry.name in added:
                    added.remove(entry.name)
            _skip(entry, package, str(why))
            continue
        before = getattr(engine, "before", "reference")
        if before is not None and before not in registered:
            warnings.warn(
                f"axiomformer: the plug-in engine {entry.name!r} of the distribution {package} asks to be tried "
                f"before {before!r}, which is not registered (registered: {', '.join(registered)}); it is tried "
                "just before the reference engine",
                PluginWarning,
                stacklevel=2,
            )
            before = "reference"
        try:
            register(engine, before=before)
        except Exception as err:  # e.g. a name that cannot be a registry key
            _skip(entry, package, f"registering it raised {type(err).__name__}: {err}")
            continue
        registered[entry.name] = package
        added.append(entry.name)
    return added


def _skip(entry: metadata.EntryPoint, package: str, why: str) -> None:
    warnings.warn(
        f"axiomformer: skipped the plug-in engine {entry.name!r} ({entry.value}) of the distribution {package} in "
        f"the entry-point group {GROUP}: {why}",
        PluginWarning,
        stacklevel=3,
    )


def _admitted(
    entry: metadata.EntryPoint,
    package: str,
    registered: dict[str, str],
    clashed: set[str],
    unregister: Callable[[str], None] | None,
) -> Any:
    """The entry's engine, or :class:`BrokenPlugin`: a built-in name keeps the built-in engine; a name two
    distributions register is kept by neither (:class:`PluginClash`)."""
    if entry.name in clashed:
        raise BrokenPlugin(LATER_CLASH)
    if entry.name in registered:

        def take_back(name: str) -> None:
            if unregister is not None:
                unregister(name)
                registered.pop(name, None)

        refuse_clash("engine", entry.name, registered[entry.name], package, take_back)
    return _load(entry)
