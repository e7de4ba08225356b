"""One registry per axis: each choice with its formula, its source, its implementation and its traits.

Engines and the spec read registries; they never compare choice names. Adding a choice to an axis is one
:class:`Choice` in that axis's file (plus its tests and docs): ``AttentionSpec``'s choice lists, error messages, the
audit matrix and the engines' routing all follow from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Choice:
    """One choice of one axis.

    Attributes:
        name: the value of the spec field, e.g. ``"softmax"``.
        formula: the formula in plain text, e.g. ``"u = exp(s) / sum_j exp(s_j)"``.
        source: paper and equation (or ``"our choice"`` with the reason in the axis file).
        impl: the implementation (a function or a module factory; its signature is the axis's own).
        traits: what engines may rely on (each axis file lists its traits and what they promise).
        extra: further implementation pieces some traits need (e.g. a score's ``dot_form``).
        relaxes: which assumption the choice relaxes and how, in words (``""`` for a choice inside the assumption);
            the design-space table's column "assumption relaxed, how".
    """

    name: str
    formula: str
    source: str
    impl: Callable[..., Any] | None = None
    traits: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)
    relaxes: str = ""

    def has(self, trait: str) -> bool:
        return trait in self.traits

    def implementation(self) -> Callable[..., Any]:
        """``impl``, on an axis where every choice has one (a choice may leave it out only where its axis says so).

        Raises:
            ValueError: the choice has none (a plug-in registered it without one).
        """
        if self.impl is None:
            raise ValueError(f"choice {self.name!r} has no implementation")
        return self.impl


class Registry:
    """The ordered choices of one axis; the first is the standard one."""

    def __init__(self, axis: str, choices: list[Choice], traits: dict[str, str] | None = None):
        self.axis = axis
        self._choices = {c.name: c for c in choices}
        self._origins: dict[str, str] = {}
        self.traits = dict(traits or {})
        unknown = {t for c in choices for t in c.traits} - set(self.traits)
        if unknown:
            raise ValueError(f"{axis}: traits {sorted(unknown)} are not declared; declared: {sorted(self.traits)}")

    def register(self, choice: Choice, *, origin: str = "axiomformer") -> Choice:
        """Add a choice (at the end); returns it.

        Args:
            origin: who registers it (a package name), named in the error on a clash.

        Raises:
            ValueError: the name is taken (naming both registrants), or a trait is not declared.
        """
        if choice.name in self._choices:
            raise ValueError(
                f"{self.axis} choice {choice.name!r} is registered twice: by "
                f"{self._origins.get(choice.name, 'axiomformer')} and by {origin}"
            )
        unknown = set(choice.traits) - set(self.traits)
        if unknown:
            raise ValueError(
                f"{self.axis} choice {choice.name!r} of {origin}: traits {sorted(unknown)} are not "
                f"declared; declared: {sorted(self.traits)}"
            )
        self._choices[choice.name] = choice
        self._origins[choice.name] = origin
        return choice

    def origin(self, name: str) -> str:
        """Who registered choice ``name``: ``"axiomformer"`` or the package of its entry point."""
        self[name]
        return self._origins.get(name, "axiomformer")

    def unregister(self, name: str) -> Choice:
        """Remove a choice (tests that plant one); returns it.

        Raises:
            ValueError: unknown name (naming the choices), or the standard (first) choice.
        """
        choice = self[name]
        if name == next(iter(self._choices)):
            raise ValueError(f"{self.axis}: the standard choice {name!r} cannot be removed")
        del self._choices[name]
        self._origins.pop(name, None)
        return choice

    def names(self) -> tuple[str, ...]:
        return tuple(self._choices)

    def __iter__(self) -> Iterator[Choice]:
        return iter(self._choices.values())

    def __contains__(self, name: object) -> bool:
        return name in self._choices

    def __getitem__(self, name: str) -> Choice:
        try:
            return self._choices[name]
        except KeyError:
            raise ValueError(f"unknown {self.axis} {name!r}; choose one of: {', '.join(self._choices)}") from None

    def has(self, name: str, trait: str) -> bool:
        """Whether choice ``name`` has ``trait``."""
        return self[name].has(trait)
