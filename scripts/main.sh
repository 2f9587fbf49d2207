#!/usr/bin/env bash
# README's first command: set up, then the Multi30k en-de recipe (examples/multi30k/run.py):
# preprocess, train with nmt-train's defaults for UPDATES (default 1600) updates, translate test2016
# with beam 5 and print sacreBLEU/chrF beside the published score at that update count. An update
# budget, not minutes, so that any machine reaches the published model (a slower one takes longer);
# MINUTES=N trains for a wall-clock budget instead. Outputs: runs/multi30k/
# Running it again resumes (and, once the budget is spent, only evaluates).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MINUTES:-}" ]; then budget=(--minutes "$MINUTES"); else budget=(--max-update "${UPDATES:-1600}"); fi

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0   # pinned first: an unpinned torch pulls the CUDA build
.venv/bin/python -m pip install -q -e ".[tensorboard,plot]"   # TensorBoard logs, nmt-plot
. .venv/bin/activate

python examples/multi30k/run.py "${budget[@]}" --out runs/multi30k
