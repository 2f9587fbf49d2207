#!/usr/bin/env bash
# Set up a virtual environment and run the main job on the bundled Multi30k en-de (README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e .
. .venv/bin/activate
nmt-preprocess --source-lang en --target-lang de \
    --trainpref data/multi30k/train --validpref data/multi30k/val \
    --testpref data/multi30k/test_2016_flickr --destdir runs/data --overwrite
