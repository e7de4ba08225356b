"""Time stepping of the feature flow: explicit Euler, classical RK4, and the Lie-Trotter and Strang splittings.

Source 2 of ``docs/SOURCES.md``: split dZ/dt = A(Z) + B(Z) into the attention field A and the label (linear) field B.
One Lie-Trotter step with explicit-Euler sub-steps,

    Z' = Z + h A(Z)          attention sublayer with residual
    Z'' = Z' + h B(Z')       linear (label / MLP) sublayer with residual

is one Transformer block with the step size h as the residual scale; Strang (half B, full A, half B) is the
second-order version. Orders (global error at a fixed end time): Euler 1, RK4 4, Lie-Trotter 1, Strang 2 — Strang
only when its sub-flows are themselves integrated to at least second order, hence the ``substep`` argument
(``"rk4"`` by default for Strang; with ``"euler"`` sub-steps it drops to first order).

``project``: a radius r > 0 puts every feature (row) back on the sphere of radius r after every full step — the
LayerNorm analogue **(our choice, not from the source)**: without it the cross-entropy flow of separable data has no
finite fixed point (features run off to infinity along their class embedding).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

VectorField = Callable[[Tensor], Tensor]
SUBSTEPS = ("euler", "rk4")


def project_to_sphere(Z: Tensor, radius: float = 1.0, eps: float = 1e-12) -> Tensor:
    """Scale every row of ``Z`` (..., n, d) to Euclidean norm ``radius`` (a zero row stays zero)."""
    return radius * Z / Z.norm(dim=-1, keepdim=True).clamp_min(eps)


def euler_step(f: VectorField, Z: Tensor, h: float) -> Tensor:
    """Z + h f(Z)."""
    return Z + h * f(Z)


def rk4_step(f: VectorField, Z: Tensor, h: float) -> Tensor:
    """One classical Runge-Kutta step (order 4)."""
    k1 = f(Z)
    k2 = f(Z + 0.5 * h * k1)
    k3 = f(Z + 0.5 * h * k2)
    k4 = f(Z + h * k3)
    return Z + (h / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)


_SUB = {"euler": euler_step, "rk4": rk4_step}


def _sub(name: str) -> Callable[[VectorField, Tensor, float], Tensor]:
    if name not in _SUB:
        raise ValueError(f"unknown substep {name!r}; choose one of: {', '.join(SUBSTEPS)}")
    return _SUB[name]


def _run(
    step: Callable[[Tensor], Tensor], Z0: Tensor, n_steps: int, project: float | None, return_trajectory: bool
) -> Tensor:
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0, got {n_steps}")
    if project is not None and project <= 0:
        raise ValueError(f"project must be a positive radius or None, got {project}")
    Z = Z0
    trajectory = [Z]
    for _ in range(n_steps):
        Z = step(Z)
        if project is not None:
            Z = project_to_sphere(Z, project)
        if return_trajectory:
            trajectory.append(Z)
    return torch.stack(trajectory) if return_trajectory else Z


def euler(
    f: VectorField, Z0: Tensor, h: float, n_steps: int, *, project: float | None = None, return_trajectory: bool = False
) -> Tensor:
    """Explicit Euler for dZ/dt = f(Z), ``n_steps`` steps of size ``h``.

    Returns:
        Z at time n_steps * h, same shape as ``Z0``; or the trajectory (n_steps + 1, *Z0.shape) with
        ``return_trajectory``.
    """
    return _run(lambda Z: euler_step(f, Z, h), Z0, n_steps, project, return_trajectory)


def rk4(
    f: VectorField, Z0: Tensor, h: float, n_steps: int, *, project: float | None = None, return_trajectory: bool = False
) -> Tensor:
    """Classical fourth-order Runge-Kutta for dZ/dt = f(Z); returns as :func:`euler`."""
    return _run(lambda Z: rk4_step(f, Z, h), Z0, n_steps, project, return_trajectory)


def lie_trotter(
    attention: VectorField,
    linear: VectorField,
    Z0: Tensor,
    h: float,
    n_steps: int,
    *,
    substep: str = "euler",
    project: float | None = None,
    return_trajectory: bool = False,
) -> Tensor:
    """Lie-Trotter splitting of dZ/dt = attention(Z) + linear(Z): a full attention step, then a full linear step.

    With ``substep="euler"`` each step is an attention sublayer with residual followed by a linear sublayer with
    residual (one Transformer block). First order. Returns as :func:`euler`.
    """
    sub = _sub(substep)
    return _run(lambda Z: sub(linear, sub(attention, Z, h), h), Z0, n_steps, project, return_trajectory)


def strang(
    attention: VectorField,
    linear: VectorField,
    Z0: Tensor,
    h: float,
    n_steps: int,
    *,
    substep: str = "rk4",
    project: float | None = None,
    return_trajectory: bool = False,
) -> Tensor:
    """Strang splitting: half a linear step, a full attention step, half a linear step (Source 2).

    Second order when the sub-steps are at least second order (``substep="rk4"``, the default); with
    ``substep="euler"`` the Euler sub-step error makes it first order. Returns as :func:`euler`.
    """
    sub = _sub(substep)
    return _run(
        lambda Z: sub(linear, sub(attention, sub(linear, Z, h / 2), h), h / 2), Z0, n_steps, project, return_trajectory
    )


INTEGRATORS = ("euler", "rk4", "lie_trotter", "strang")


def integrate(
    method: str,
    *,
    attention: VectorField,
    linear: VectorField,
    Z0: Tensor,
    h: float,
    n_steps: int,
    project: float | None = None,
    return_trajectory: bool = False,
) -> Tensor:
    """Integrate dZ/dt = attention(Z) + linear(Z) with one of :data:`INTEGRATORS`.

    Raises:
        ValueError: unknown method (naming the valid ones).
    """
    if method in SUBSTEPS:  # euler, rk4: the whole field in one step
        sub = _SUB[method]
        return _run(lambda Z: sub(lambda X: attention(X) + linear(X), Z, h), Z0, n_steps, project, return_trajectory)
    splittings = {"lie_trotter": lie_trotter, "strang": strang}
    if method not in splittings:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(INTEGRATORS)}")
    return splittings[method](attention, linear, Z0, h, n_steps, project=project, return_trajectory=return_trajectory)
