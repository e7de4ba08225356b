"""Run a study: plan the sweep, train what the store lacks, compute the report sections, write the report.

Backends (all write to the store from this driver process, one transaction per finished run):

* ``local`` with ``workers = 1``: runs train one after another in this process;
* ``local`` with ``workers > 1``: a pool of spawned worker processes (one torch thread each unless ``threads`` says);
* ``ray``: each run is a Ray task (``ray.init(address=...)`` with an address, a local Ray otherwise); results are
  stored as tasks finish. Ray is an optional extra: ``pip install 'axiomformer[ray]'``.

Training is deterministic for a given config and thread count, so every backend gives the same results for the same
seeds. Resuming: runs whose key is in the store are skipped, so rerunning an interrupted study with the same out dir
trains only what is missing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import Progress, TaskID

from axiomformer.study.config import CONTROLS, StudyConfig
from axiomformer.study.record import RunRecord
from axiomformer.study.sections import audit_spec, ceilings_section, derive_section, flow_section, missing_module
from axiomformer.study.store import ResultsStore
from axiomformer.study.sweep import Run, models

if TYPE_CHECKING:
    from multiprocessing.queues import SimpleQueue

BACKENDS = ("local", "ray")


class StudyError(RuntimeError):
    """A study that cannot run (unknown backend, Ray missing, parameter matching impossible)."""


# ---------------------------------------------------------------------------------------------------- provenance
@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, str | None]:
    """Package version and git commit of the running axiomformer (``None`` outside a git checkout)."""
    import axiomformer

    commit = None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(axiomformer.__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        if out.returncode == 0:
            commit = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package_version": axiomformer.__version__, "git_commit": commit}


# ---------------------------------------------------------------------------------------------------- one run
_WARM: set[tuple[str, str]] = set()


def execute(
    train_config: dict[str, Any],
    threads: int | None = None,
    workdir: str | None = None,
    save_state: str | None = None,
    progress: str | None = None,
) -> dict[str, Any]:
    """Train one run and return ``TrainResult.to_dict()`` (the function every backend calls, in any process).

    The trainer measures ``peak_mem_mb`` itself (:class:`axiomformer.memory.PeakMemory`); a reading of 0 (no growth
    seen) is stored as None with ``memory_source`` saying it was unavailable. The first run of a
    (task, model kind) in a process is preceded by a 2-step warm-up, so that one-time initialization (library loading,
    first allocations) is not counted as the model's memory **(our choice)**.

    Args:
        train_config: keyword arguments of :class:`axiomformer.train.TrainConfig`.
        threads: torch CPU threads for this run (restored afterwards); ``None`` keeps the current setting.
        workdir: the study's out dir; a relative ``init_from`` and ``save_state`` are resolved against it.
        save_state: where to keep the trained weights (a later run's ``init_from``).
        progress: the run's progress file (``train(progress_file=...)``): a run the study was stopped in resumes
            at its last evaluation when the study is run again.
    """
    from axiomformer import train as trainer
    from axiomformer.runtime import torch_threads

    root = Path(workdir) if workdir else Path(".")
    if train_config.get("init_from"):
        train_config = train_config | {"init_from": str(root / train_config["init_from"])}
    config = trainer.TrainConfig(**train_config)
    with torch_threads(threads):
        warm = (config.task, config.model)
        if warm not in _WARM:
            _WARM.add(warm)
            trainer.train(
                config.model_copy(
                    update={
                        "steps": 2,
                        "eval_batches": 1,
                        "eval_every": 2,
                        "init_from": None,
                        "seq_len": min(config.seq_len, 64),
                    }
                ),
                progress=False,
            )
        cpu = time.process_time()
        # Any: a TrainResult, or the plain mapping a stand-in trainer (tests, the Ray smoke run) returns
        state, kept = (root / name if name else None for name in (save_state, progress))
        result: Any = trainer.train(config, progress=False, save_state=state, progress_file=kept)
    out = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    # a run resumed from its progress file: its earlier processes' CPU time counts too
    out["cpu_seconds"] = time.process_time() - cpu + float(out.get("earlier_cpu_seconds") or 0.0)
    out["memory_source"] = out.get("memory_method") or "trainer"
    if not out.get("peak_mem_mb"):
        # Training allocates (activations, gradients): no growth over the level at the start means the method could
        # not see this run's peak, not that it had none.
        out["peak_mem_mb"] = None
        out["memory_source"] = f"unavailable: no growth measured ({out['memory_source']})"
    return out


def execute_in_worker(*args: Any) -> dict[str, Any]:
    """:func:`execute` in a worker process the study started (pool, Ray): the run owns that process's memory
    readings (:func:`axiomformer.memory.owning_process_memory`), as the command line does for the serial backend."""
    from axiomformer.memory import owning_process_memory

    with owning_process_memory():
        return execute(*args)


def _assumptions(run: Run) -> tuple[dict[str, bool], str | None]:
    """Which of A0-A5 the run's model keeps, and its relax string (``None`` for a model without scores)."""
    from axiomformer.spec import AttentionSpec, stack_assumptions, stack_specs

    if run.model.kind == "transformer":
        tc = run.train_config
        standard = AttentionSpec.standard(tc["dim"], tc["heads"], causal=True)
        return {"A0": True, **stack_assumptions(stack_specs(standard, run.model.spec, tc["layers"]))}, run.model.spec
    if run.model.kind in CONTROLS:
        return {}, None  # a validity control: no scores to hold assumptions about
    return {"A0": False}, None  # a recurrent aggregator is order-dependent: A0 itself relaxed


_OUTCOME = ("val_accuracy", "val_loss", "best_step", "converged", "stop_reason", "history", "extra", "n_test")
_MEASURED = (
    "params",
    "accuracy",
    "loss",
    "steps",
    "seconds",
    "cpu_seconds",
    "tokens_per_second",
    "peak_mem_mb",
    "memory_source",
    "engine",
    "losses",
)


def _row(run: Run, result: dict[str, Any], backend: str) -> RunRecord:
    """The :class:`~axiomformer.study.record.RunRecord` of a finished run (validated here, as the store will)."""
    assumptions, spec = _assumptions(run)
    tc = run.train_config
    record = {
        "key": run.key,
        "label": run.model.label,
        "model": run.model.kind,
        "spec": spec,
        "assumptions": assumptions,
        "task": run.task,
        "seq_len": run.seq_len,
        "task_config": {
            "task": run.task,
            "seq_len": run.seq_len,
            "options": tc.get("task_options", {}),
            "chance": result.get("chance"),
        },
        "seed": run.seed,
        "dim": tc["dim"],
        "layers": tc["layers"],
        "heads": tc["heads"] if run.model.kind == "transformer" else None,
        **{k: result.get(k) for k in _MEASURED},
        "train_config": tc,
        "outcome": {"lr": tc.get("lr"), **{k: result.get(k) for k in _OUTCOME}},
        **provenance(),
        "backend": backend,
        "host": platform.node(),
    }
    return RunRecord.model_validate(record)


# ---------------------------------------------------------------------------------------------------- backends
Outcome = tuple[Run, "dict[str, Any] | BaseException"]


PROGRESS_DIR = "progress"
"""Folder of the out dir that holds the progress files of runs under way (removed as each run finishes)."""


def _args(run: Run, workdir: str) -> tuple[str, str | None, str]:
    """``execute``'s arguments after the threads: the out dir, the state to save and the run's progress file."""
    name = hashlib.sha256(run.key.encode()).hexdigest()[:24]
    return workdir, run.state_path if run.save_state else None, f"{PROGRESS_DIR}/{name}.pt"


def _serial(runs: list[Run], threads: int | None, workdir: str) -> Iterator[Outcome]:
    for run in runs:
        try:
            yield run, execute(run.train_config, threads, *_args(run, workdir))
        except Exception as err:
            err.__traceback_text__ = traceback.format_exc()  # type: ignore[attr-defined]
            yield run, err


def _die_with_parent(parent: int) -> None:
    """Make this worker exit when the study process that started it dies, even by ``kill -9``: Linux's
    parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), else a watchdog thread that polls the parent."""
    import ctypes
    import signal
    import threading

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG = 1
            if os.getppid() != parent:  # the parent died before the prctl
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def worker_init(parent: int, started: SimpleQueue[int] | None = None) -> None:
    """Initializer of a study worker process: the study process alone answers Ctrl-C (a terminal's Ctrl-C reaches
    the whole process group; the workers ignore it and are stopped by the study), the worker exits when the study
    process dies (:func:`_die_with_parent`), and it reports its pid on ``started`` (so the study can stop it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    if started is not None:
        started.put(os.getpid())


def _stop_workers(started: SimpleQueue[int]) -> None:
    """SIGKILL every worker that reported its pid: their runs are dropped (a rerun trains them). They are this
    process's unreaped children, so no pid can have been reused."""
    import signal

    while not started.empty():
        try:
            os.kill(started.get(), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _pool(runs: list[Run], threads: int | None, workers: int, workdir: str) -> Iterator[Outcome]:
    """Runs on ``workers`` spawned processes, yielded as they finish. On Ctrl-C (or any early exit of the caller)
    the queued runs are cancelled and the runs in progress stopped at once: none of them is stored, and a rerun
    trains them. A worker that dies (e.g. out of memory) fails its run (``BrokenProcessPool``)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("spawn")
    started = context.SimpleQueue()
    executor = ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=worker_init, initargs=(os.getpid(), started)
    )
    finished = False
    try:
        pending = {
            executor.submit(execute_in_worker, run.train_config, threads or 1, *_args(run, workdir)): run
            for run in runs
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                run = pending.pop(future)
                err = future.exception()
                yield run, (err if err is not None else future.result())
        finished = True
    finally:
        if not finished:
            _stop_workers(started)
        executor.shutdown(wait=finished, cancel_futures=True)
        started.close()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise StudyError("the ray backend needs Ray: pip install 'axiomformer[ray]'") from None
    return ray


def _ray(runs: list[Run], threads: int | None, address: str | None, workdir: str) -> Iterator[Outcome]:
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        ray.init(address=address, **kwargs) if address else ray.init(**kwargs)
        started = True
    # max_retries=0: a worker that dies (killed, out of memory) fails its run, as with the local pool: the study
    # records the failure and goes on, and a rerun trains the run (Ray would otherwise rerun it up to 3 times)
    task = ray.remote(num_cpus=1, max_retries=0)(execute_in_worker)
    refs = {task.remote(run.train_config, threads or 1, *_args(run, workdir)): run for run in runs}
    try:
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                run = refs.pop(ref)
                try:
                    yield run, ray.get(ref)
                except Exception as err:
                    yield run, err
    finally:
        for ref in refs:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------------- the study
@dataclass
class StudySummary:
    """What a call to :func:`run_study` did."""

    out_dir: Path
    planned: int
    already_stored: int
    trained: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    report: Mapping[str, object] = field(default_factory=dict)  # report.ReportPaths once written


def _num(value: Any, fmt: str) -> str:
    """``value`` formatted, or "n/a" for a missing or non-numeric one (a diverged run has no loss)."""
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "n/a"


def _status(run: Run, result: dict[str, Any]) -> str:
    tps = result.get("tokens_per_second")
    return (
        f"{run.model.label:<22} {run.task_label:<12} seed {run.seed} lr {run.train_config.get('lr')}: "
        f"test acc {_num(result.get('accuracy'), '.3f')} (val {_num(result.get('val_accuracy'), '.3f')}, "
        f"{result.get('steps')} steps, {result.get('stop_reason')})"
        f"  loss {_num(result.get('loss'), '.3f')}  {_num(result.get('seconds'), '5.1f')} s"
        f"  {_num(tps / 1e3 if isinstance(tps, (int, float)) else None, '6.1f')}k tok/s"
        f"  params {result.get('params')}  [{result.get('engine')}]"
    )


def _check_backend(backend: str) -> None:
    """Refuse an unknown backend, or Ray where it is not installed (:class:`StudyError`)."""
    if backend not in BACKENDS:
        raise StudyError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if backend == "ray":
        _import_ray()


def run_study(
    config: StudyConfig,
    out_dir: str | Path,
    *,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    console: Console | None = None,
    write_report: bool = True,
) -> StudySummary:
    """Run (or resume) a study in ``out_dir`` and write its report.

    Args:
        config: the validated sweep.
        out_dir: where ``results.sqlite``, ``report.md``, ``report.html`` and ``figures/`` go (created).
        backend: ``local`` or ``ray``.
        address: Ray cluster address (``ray`` backend only); ``None`` starts a local Ray.
        progress: show the overall progress bar (status lines are printed either way).
        console: where to print (default: a new rich console on stdout).
        write_report: build the report at the end.

    Raises:
        StudyError: unknown backend, Ray not installed, or a model whose parameters cannot be matched.
        KeyboardInterrupt: passed on after the finished runs are safely stored.
    """
    _check_backend(backend)
    console = console or Console()
    out_dir = Path(out_dir)
    start, load_start = time.perf_counter(), _load()
    stages, first = _stages(config)
    with ResultsStore(out_dir) as store:
        store.set_meta("config", config.model_dump())
        store.set_meta("models", [{"label": m.label, "kind": m.kind, "spec": m.spec} for m in models(config)])
        summary = StudySummary(out_dir=out_dir, planned=0, already_stored=0)
        audits_todo, sections_todo = _extras_todo(store, config)
        console.print(
            f"study ({config.suite} suite): {len(stages)} stage(s), {len(first)} run(s) in the first, "
            f"results in {store.path} ({backend} backend)",
            markup=False,
            soft_wrap=True,
        )
        bar = _progress(console, progress)
        with bar:
            task_id = bar.add_task("study", total=len(audits_todo) + len(sections_todo))
            _audits(store, audits_todo, console, bar, task_id)
            # the task ceilings first (cheap): a store stopped part-way can still say which task discriminates
            _sections(store, [s for s in sections_todo if s[0] == "ceilings"], console, bar, task_id)
            session = _Session(store, config, backend, address, summary, console, bar, task_id)
            _run_stages(session, stages, first)
            _sections(store, [s for s in sections_todo if s[0] != "ceilings"], console, bar, task_id)
            bar.update(task_id, description="done")
        summary.seconds = time.perf_counter() - start
        _record_invocation(store, _invocation(summary, config, backend, load_start))
    if write_report:
        from axiomformer.study.report import build_report

        summary.report = build_report(out_dir)
    return summary


def _stages(config: StudyConfig) -> tuple[list[Callable], list[Run]]:
    """The study's stages (its suite's, else :func:`~axiomformer.study.stages.stages_for`) and the first's runs.

    Raises:
        StudyError: the config does not fit the suite (a ``ValueError`` of the stage builders).
    """
    from axiomformer.study.registry import get_suite

    try:
        from axiomformer.study.stages import stages_for

        stages = (get_suite(config.suite).stages or stages_for)(config)
        first = stages[0](None)
    except ValueError as err:
        raise StudyError(str(err)) from None
    return stages, first


def _extras_todo(store: ResultsStore, config: StudyConfig) -> tuple[list[str], list[tuple[str, Callable[[], Any]]]]:
    """The attention audits and the (name, builder) sections the config asks for that ``store`` lacks."""
    specs = [m.spec for m in models(config) if m.kind == "transformer"] if config.sections.audit else []
    audits_todo = [s for s in dict.fromkeys(specs) if s not in store.audits()]
    stored_sections = store.sections()
    cells = ceiling_cells(config)
    stale = {"ceilings"} if _ceilings_stale(stored_sections, cells) else set()
    sections_todo = [
        (name, fn)
        for name, fn, on in (
            ("ceilings", lambda: ceilings_section(cells), True),
            ("derive", derive_section, config.sections.derive),
            ("flow", flow_section, config.sections.flow),
        )
        if on and (name not in stored_sections or name in stale)
    ]
    return audits_todo, sections_todo


def _ceilings_stale(stored_sections: dict[str, dict[str, Any]], cells: list[dict[str, Any]]) -> bool:
    """Whether the stored ceilings section lacks a task and length of ``cells`` or holds one with other task options
    (a resumed store whose config gained or changed a task); an entry stored without its options is taken as
    current."""
    payload = (stored_sections.get("ceilings") or {}).get("payload") or {}
    for cell in cells:
        entry = payload.get(f"{cell['task']}@{cell['seq_len']}")
        if entry is None or entry.get("options", cell["options"]) != cell["options"]:
            return True
    return False


def ceiling_cells(config: StudyConfig) -> list[dict[str, Any]]:
    """Each task and length of ``config`` with the batch size and test batches its runs are scored with."""
    from axiomformer.study.sweep import cell_budget
    from axiomformer.train import TrainConfig

    out = []
    for task in config.tasks:
        for seq_len in task.seq_lens:
            budget = cell_budget(config, task, seq_len)
            tc = TrainConfig(
                task=task.name,
                seq_len=seq_len,
                task_options=dict(task.options),
                model="gru",
                dim=8,
                **{k: budget[k] for k in ("batch_size", "eval_batches", "test_batches") if budget.get(k)},
            )
            out.append(
                {
                    "task": task.name,
                    "seq_len": seq_len,
                    "options": dict(task.options),
                    "batch_size": tc.batch_size,
                    "test_batches": tc.test_batches or tc.eval_batches,
                }
            )
    return out


@dataclass
class _Session:
    """One call of :func:`run_study`: its store and config, the backend it trains on, what it has done so far
    (``summary``) and where it reports (``console``, the progress ``bar`` and its task)."""

    store: ResultsStore
    config: StudyConfig
    backend: str
    address: str | None
    summary: StudySummary
    console: Console
    bar: Progress
    task_id: TaskID


def _run_stages(session: _Session, stages: list[Callable], first: list[Run]) -> None:
    """Plan and train each stage in turn (a later stage sees the stored runs), counting them in the summary."""
    store, summary, bar, task_id = session.store, session.summary, session.bar, session.task_id
    planned: dict[str, Run] = {}
    for index, stage in enumerate(stages):
        runs = first if index == 0 else stage({r.key: r for r in store.runs()})
        new = [r for r in runs if r.key not in planned]
        planned.update((r.key, r) for r in new)
        _set_planned(store, planned)
        done = store.finished_keys()
        todo = [r for r in new if r.key not in done]
        summary.planned += len(new)
        summary.already_stored += len(new) - len(todo)
        bar.update(task_id, total=(bar.tasks[0].total or 0) + len(todo))
        session.console.print(
            f"stage {index + 1}/{len(stages)}: {len(new)} run(s), {len(new) - len(todo)} already "
            f"stored, {len(todo)} to train",
            markup=False,
            soft_wrap=True,
        )
        _train(session, todo)


def _invocation(
    summary: StudySummary, config: StudyConfig, backend: str, load_start: list[float] | None
) -> dict[str, Any]:
    """What this call of the study did and on what machine load (the report's provenance)."""
    return {
        "seconds": round(summary.seconds, 2),
        "trained": summary.trained,
        "backend": backend,
        "workers": config.resolved_workers() if backend == "local" else None,
        "load_average_start": load_start,
        "load_average_end": _load(),
        "cpu_count": os.cpu_count(),
    }


def _record_invocation(store: ResultsStore, record: dict[str, Any]) -> None:
    """Keep the provenance of every call (meta ``invocations``, oldest first, each with its UTC time) and, as
    ``last_invocation`` (what the report shows), the last call that trained something: a rerun of a finished study
    trains nothing and must not replace the record of the real run."""
    from datetime import datetime, timezone

    record = {**record, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    store.set_meta("invocations", [*store.get_meta("invocations", []), record])
    if record["trained"] or store.get_meta("last_invocation") is None:
        store.set_meta("last_invocation", record)


def _set_planned(store: ResultsStore, planned: dict[str, Run]) -> None:
    store.set_meta(
        "planned",
        [
            {
                "key": r.key,
                "label": r.model.label,
                "task": r.task,
                "seq_len": r.seq_len,
                "seed": r.seed,
                "lr": r.train_config.get("lr"),
                "dim": r.train_config["dim"],
                "expected_params": r.expected_params,
            }
            for r in planned.values()
        ],
    )


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _progress(console: Console, enabled: bool) -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


def _audits(store: ResultsStore, specs: list[str], console: Console, bar: Progress, task_id: TaskID) -> None:
    for spec in specs:
        bar.update(task_id, description=f"audit {spec}")
        try:
            store.put_audit(spec, audit_spec(spec))
        except ImportError as err:
            if not missing_module(err):
                raise
            console.print("audit: axiomformer.audit not available; the report will say so")
            bar.advance(task_id, len(specs) - specs.index(spec))
            return
        except Exception as err:
            store.put_audit(spec, {"error": f"{type(err).__name__}: {err}"})
        bar.advance(task_id)


def _sections(
    store: ResultsStore, todo: list[tuple[str, Callable[[], Any]]], console: Console, bar: Progress, task_id: TaskID
) -> None:
    for name, fn in todo:
        bar.update(task_id, description=f"{name} section")
        t0 = time.perf_counter()
        try:
            store.put_section(name, fn(), time.perf_counter() - t0)
            console.print(f"{name}: done in {time.perf_counter() - t0:.1f} s")
        except ImportError as err:
            if not missing_module(err):
                raise
            console.print(f"{name}: module not available; the report will say so")
        except Exception as err:
            console.print(f"{name} failed: {type(err).__name__}: {err}", style="red", markup=False, soft_wrap=True)
        bar.advance(task_id)


def _train(session: _Session, todo: list[Run]) -> None:
    """Train ``todo`` on the session's backend, storing each run (or its failure) as it finishes."""
    if not todo:
        return
    store, config, summary, console = session.store, session.config, session.summary, session.console
    bar, task_id = session.bar, session.task_id
    workdir = str(Path(store.path).parent.resolve())
    if session.backend == "ray":
        outcomes = _ray(todo, config.threads, session.address, workdir)
    elif config.resolved_workers() > 1 and len(todo) > 1:
        outcomes = _pool(todo, config.threads, min(config.resolved_workers(), len(todo)), workdir)
    else:
        outcomes = _serial(todo, config.threads, workdir)
    n = summary.already_stored + summary.trained + len(summary.failed)
    bar.update(task_id, description="training")
    for run, result in outcomes:
        n += 1
        if isinstance(result, BaseException):
            text = getattr(result, "__traceback_text__", None) or "".join(
                traceback.format_exception(type(result), result, result.__traceback__)
            )
            store.add_failure(run.key, run.model.label, run.task, run.seq_len, run.seed, text)
            summary.failed.append(run.key)
            console.print(
                f"[{n}/{summary.planned}] FAILED {run.model.label} {run.task_label} seed {run.seed}: "
                f"{type(result).__name__}: {result}",
                style="red",
                markup=False,
                soft_wrap=True,
            )
        else:
            store.add_run(_row(run, result, session.backend))
            summary.trained += 1
            console.print(
                f"[{n}/{summary.planned}] {_status(run, result)}", markup=False, highlight=False, soft_wrap=True
            )
        bar.advance(task_id)
