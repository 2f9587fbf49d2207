#!/usr/bin/env bash
# Two corpora blended by weight: the first half of Multi30k as "in-domain", the second half as a
# larger "out-of-domain" corpus, sampled 50/50 per epoch whatever their sizes.
# Run from the repository root inside the virtual environment that scripts/main.sh creates.
set -euo pipefail
OUT="${OUT:-runs/blend}"
mkdir -p "$OUT/raw"
for lang in en de; do
    zcat "data/multi30k/train.$lang.gz" | head -n 5000 > "$OUT/raw/indomain.$lang"
    zcat "data/multi30k/train.$lang.gz" | tail -n +5001 > "$OUT/raw/web.$lang"
done
nmt-preprocess -s en -t de --trainpref "$OUT/raw/indomain,$OUT/raw/web" --validpref data/multi30k/val \
    --destdir "$OUT/data" --overwrite
nmt-train "$OUT/data" --train-subsets train,train1 --subset-weights 0.5,0.5 --epoch-samples 20000 \
    --arch transformer_tiny --share-all-embeddings --max-tokens 4096 --layout packed \
    --max-epoch "${MAX_EPOCH:-2}" --save-dir "$OUT/ckpt" --log-interval 20
