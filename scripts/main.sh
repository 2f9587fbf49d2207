#!/usr/bin/env bash
# README's first command: set up, then the Multi30k en-de recipe (examples/multi30k/run.py):
# preprocess, train with nmt-train's defaults for MINUTES (default 12) of wall clock, average the
# last checkpoints from 20 minutes on, translate test2016 with beam 5 and print sacreBLEU/chrF. Outputs: runs/multi30k/
# Running it again resumes (and, once the budget is spent, only evaluates).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${MINUTES:-12}"

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0   # pinned first: an unpinned torch pulls the CUDA build
.venv/bin/python -m pip install -q -e ".[tensorboard,plot]"   # TensorBoard logs, nmt-plot
. .venv/bin/activate

python examples/multi30k/run.py --minutes "$MINUTES" --out runs/multi30k
