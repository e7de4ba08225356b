"""The report sections besides training: the audit verdict per spec, the derivation check and the flow experiment.

Each calls another part of axiomformer lazily, so a build without it still runs a study (the report then says
"not available"), and returns JSON-ready data for the store.
"""

from __future__ import annotations

from typing import Any


def _audit_payload(report: Any) -> dict[str, Any]:
    if hasattr(report, "to_dict"):
        return _jsonable(report.to_dict())
    checks = []
    for check in getattr(report, "checks", []):
        item = {name: getattr(check, name, None) for name in ("name", "assumption", "passed")}
        for extra in ("detail", "message", "value", "error"):
            if getattr(check, extra, None) is not None:
                item[extra] = str(getattr(check, extra))
        checks.append(item)
    return {"checks": checks}


def audit_spec(spec: str) -> dict[str, Any]:
    """Run ``axiomformer.audit.run_audit("spec:<relax string>")`` and return its checks as JSON-ready dicts."""
    from axiomformer.audit import run_audit

    return _audit_payload(run_audit(f"spec:{spec}"))


def _jsonable(value: Any) -> Any:
    import json

    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return json.loads(json.dumps(value, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)))


def derive_section() -> Any:
    """The derivation chain check ``axiomformer.derive.run_derivation()`` as JSON (``axiomformer derive --json``):
    ``{"passed", "first_failed_step", "final_vs_sdpa_max_abs_err", "scale_argument", "steps": [...]}``."""
    from axiomformer.derive import run_derivation

    return _jsonable(run_derivation())


def flow_section() -> Any:
    """The flow experiment on the 8x8 digits as 4 tokens of 4x4, quick protocol, K in {0, 2}
    (``axiomformer.flows.run_flow_experiment``; the full experiment is ``axiomformer flow``)."""
    from axiomformer.flows import run_flow_experiment
    from axiomformer.flows.experiment import default_config

    return _jsonable(
        run_flow_experiment(
            dataset="digits", quick=True, noise=(0.0, 1.0), config=default_config(True, patch=4, K=(0, 2))
        )
    )


def task_test_items(
    task: str, seq_len: int, options: dict[str, Any], batch_size: int, batches: int
) -> tuple[Any, Any, Any]:
    """The test items every run of a study cell is scored on: ``(task, inputs, targets)``, the inputs and targets int64
    (batches * batch_size, seq_len), exactly as the trainer draws its test split (``train._eval_set``)."""
    import torch

    from axiomformer.tasks import make_task

    built = make_task(task, seq_len=seq_len, **options)
    pairs = [built.batch(batch_size, seed=i, split="test") for i in range(batches)]
    return built, torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])


def ceilings_section(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The ceiling of each task on its own test items (``Task.ceiling``), keyed ``"task@seq_len"``: ``{"ceiling",
    "ceiling_method", "ceiling_error", "note", "n_items", "options"}``; ``ceiling`` is ``None`` where the task cannot
    compute one. ``cells``: ``{"task", "seq_len", "options", "batch_size", "test_batches"}`` per task and length."""
    out: dict[str, Any] = {}
    for cell in cells:
        built, inputs, targets = task_test_items(
            cell["task"], cell["seq_len"], cell["options"], cell["batch_size"], cell["test_batches"]
        )
        found = built.ceiling(inputs, targets)
        out[f"{cell['task']}@{cell['seq_len']}"] = {
            "ceiling": None if found is None else found.value,
            "ceiling_method": None if found is None else found.method,
            "ceiling_error": None if found is None else found.error,
            "note": "this task cannot compute its ceiling" if found is None else found.note,
            "n_items": int((targets != -100).sum()),
            "options": dict(cell["options"]),
        }
    return out


def missing_module(err: ImportError) -> bool:
    """True when ``err`` says a module (or a name in it) does not exist, as opposed to a failure inside it."""
    return isinstance(err, ModuleNotFoundError) or "cannot import name" in str(err)
