#!/usr/bin/env bash
# Set up a virtual environment and run the test suite (README's second command).
# torch is installed first, pinned: an unpinned resolve pulls the CUDA build (GBs).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -m pytest -q tests "$@"
