#!/usr/bin/env bash
# Multi30k en-de with transformer_tiny on CPU (or GPU when there is one): preprocess, train, test.
# Run from the repository root inside the virtual environment that scripts/main.sh creates.
set -euo pipefail
OUT="${OUT:-runs/multi30k}"
MAX_UPDATE="${MAX_UPDATE:-1500}"
nmt-preprocess -s en -t de --trainpref data/multi30k/train --validpref data/multi30k/val \
    --testpref data/multi30k/test_2016_flickr --destdir "$OUT/data" --overwrite
nmt-train "$OUT/data" --arch transformer_tiny --share-all-embeddings --max-tokens 4096 --layout packed \
    --lr 1e-3 --warmup-updates 1000 --dropout 0.3 --label-smoothing 0.1 --clip-norm 1.0 \
    --max-update "$MAX_UPDATE" --validate-interval-updates 500 --no-epoch-checkpoints \
    --save-dir "$OUT/ckpt" --tensorboard-logdir "$OUT/tensorboard" --log-interval 50
nmt-eval "$OUT/data" --path "$OUT/ckpt/checkpoint_best.pt" --split test --beam 5 --output "$OUT/test.hyp.de"
