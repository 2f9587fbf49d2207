#!/usr/bin/env bash
# README's first command: set up, then preprocess -> train -> translate and score on the bundled
# Multi30k en-de. MAX_UPDATE (default 1500) sets the training length; outputs go to runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_UPDATE="${MAX_UPDATE:-1500}"

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0   # pinned first: an unpinned torch pulls the CUDA build
.venv/bin/python -m pip install -q -e ".[tensorboard,plot]"   # TensorBoard logs, nmt-plot
. .venv/bin/activate

nmt-preprocess --source-lang en --target-lang de \
    --trainpref data/multi30k/train --validpref data/multi30k/val \
    --testpref data/multi30k/test_2016_flickr --destdir runs/data --overwrite

# A fresh run each time (nmt-train would otherwise resume from runs/ckpt/checkpoint_last.pt).
rm -rf runs/ckpt runs/tensorboard
nmt-train runs/data --arch transformer_tiny --share-all-embeddings --max-tokens 4096 --layout packed \
    --lr 1e-3 --warmup-updates 1000 --dropout 0.3 --label-smoothing 0.1 --clip-norm 1.0 \
    --max-update "$MAX_UPDATE" --validate-interval-updates 500 --no-epoch-checkpoints \
    --save-dir runs/ckpt --tensorboard-logdir runs/tensorboard --log-interval 50

nmt-plot runs/tensorboard -o runs/curves.png   # loss, valid loss, lr against updates and minutes

nmt-eval runs/data --path runs/ckpt/checkpoint_best.pt --split test --beam 5 \
    --output runs/test.hyp.de
