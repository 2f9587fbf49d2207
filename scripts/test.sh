#!/usr/bin/env bash
# Set up a virtual environment, lint, check the formatting and run the test suite without its slow
# end-to-end proofs (README's second command; .ci/run calls it, then runs `pytest -m slow`). torch is
# installed first, pinned: an unpinned resolve pulls the CUDA build (GBs). Arguments go to pytest
# (`bash scripts/test.sh -m slow` runs the slow set, `-m ''` everything; `-n 0` one process). Two
# pytest-xdist workers: half the suite's wall time is spent waiting on subprocesses and servers.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q -n 2 tests -m "not slow" "$@"
