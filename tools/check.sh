#!/usr/bin/env bash
# The habits of a Python project, in one command: lint, format, types and docstring coverage of the public API.
# Each check runs even when an earlier one fails; the exit status is non-zero when any failed. Configuration lives in
# pyproject.toml ([tool.ruff], [tool.mypy], [tool.interrogate]). Modules that do not pass mypy yet are listed in
# pyproject.toml's mypy-baseline block (tools/mypy_baseline.py rewrites it; --check says which can leave it).
#   tools/check.sh            run every check
#   tools/check.sh ruff mypy  run the named ones (ruff, format, mypy, docstrings)
set -uo pipefail
cd "$(dirname "$0")/.."

checks=("$@")
[ ${#checks[@]} -eq 0 ] && checks=(ruff format mypy docstrings)
failed=()

run() {
    local name="$1"; shift
    echo "== $name: $*"
    if "$@"; then echo "-- $name: ok"; else echo "-- $name: FAILED"; failed+=("$name"); fi
}

for check in "${checks[@]}"; do
    case "$check" in
        ruff) run ruff ruff check . ;;
        format) run format ruff format --check . ;;
        mypy) run mypy mypy ;;
        docstrings) run docstrings interrogate src/axiomformer ;;
        *) echo "error: unknown check '$check'; choose from: ruff, format, mypy, docstrings" >&2; exit 2 ;;
    esac
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}"
    exit 1
fi
echo "all checks passed"
