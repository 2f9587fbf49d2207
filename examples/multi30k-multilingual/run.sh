#!/usr/bin/env bash
# One model for six directions (en<->de, en<->fr, en<->cs) against six bilingual models at equal
# compute: the multilingual model trains N minutes, each bilingual model N/6; then every direction
# of test_2016_flickr is translated (beam 5) and scored (cased sacreBLEU, chrF2, off-target %), and
# the multilingual model's zero-shot de->fr.
#
#   bash examples/multi30k-multilingual/run.sh [--minutes N] [--out DIR] [--lang-tok encoder|decoder] [--beam K] [-- nmt-train flags]
#
# Run from the repository root inside the virtual environment. The table goes to DIR/table.md
# (examples/multi30k-multilingual/README.md has the one measured here). Re-running with the same
# --out keeps the datasets and resumes the runs (a finished run is only evaluated).
set -euo pipefail

usage() { sed -n '6p' "$0" | sed 's/^#  *//' >&2; exit 2; }
minutes=30 out=runs/multi30k-multilingual lang_tok=encoder beam=5
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="${2:?--minutes needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --lang-tok) lang_tok="${2:?--lang-tok needs a value}"; shift 2 ;;
        --beam) beam="${2:?--beam needs a value}"; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "examples/multi30k-multilingual/run.sh: unknown option $1" >&2; usage ;;
    esac
done
pairs=(en-de de-en en-fr fr-en en-cs cs-en)
hours() { python3 -c "print($1 / 60)"; }
splits=(--trainpref data/multi30k/train --validpref data/multi30k/val --testpref data/multi30k/test_2016_flickr)

# --- the multilingual model: one dataset (each language side encoded once), N minutes
if [ ! -f "$out/multi/data/manifest.json" ]; then
    nmt-preprocess --lang-pairs "$(IFS=,; echo "${pairs[*]}")" "${splits[@]}" \
        --destdir "$out/multi/data" --overwrite
fi
nmt-train "$out/multi/data" --save-dir "$out/multi/ckpt" --stop-time-hours "$(hours "$minutes")" \
    --lang-tok "$lang_tok" --sampling-temperature 5 --no-epoch-checkpoints \
    --log-file "$out/multi/train.log" "$@"

# --- six bilingual models, N/6 minutes each (the same defaults and flags)
for pair in "${pairs[@]}"; do
    src=${pair%-*} tgt=${pair#*-}
    if [ ! -f "$out/$pair/data/manifest.json" ]; then
        nmt-preprocess -s "$src" -t "$tgt" "${splits[@]}" --destdir "$out/$pair/data" --overwrite
    fi
    nmt-train "$out/$pair/data" --save-dir "$out/$pair/ckpt" \
        --stop-time-hours "$(hours "$minutes / 6")" --no-epoch-checkpoints \
        --log-file "$out/$pair/train.log" "$@"
done

# --- every direction on test_2016_flickr, both systems
for pair in "${pairs[@]}"; do
    src=${pair%-*} tgt=${pair#*-}
    nmt-eval "$out/multi/data" --path "$out/multi/ckpt/checkpoint_last.pt" --split test \
        -s "$src" -t "$tgt" --beam "$beam" --off-target --quiet > "$out/multi/test.$pair.scores"
    nmt-eval "$out/$pair/data" --path "$out/$pair/ckpt/checkpoint_last.pt" --split test \
        --beam "$beam" --output "$out/$pair/test.hyp.$tgt" > "$out/$pair/test.scores"
done
# Zero-shot de->fr (a direction never trained): the multilingual model only, with --zero-shot.
nmt-eval --path "$out/multi/ckpt/checkpoint_last.pt" -s de -t fr --zero-shot --beam "$beam" \
    --input data/multi30k/test_2016_flickr.de.gz --reference data/multi30k/test_2016_flickr.fr.gz \
    --off-target --quiet > "$out/multi/test.de-fr.zero-shot.scores"
python3 examples/multi30k-multilingual/table.py "$out" "${pairs[@]}" | tee "$out/table.md"
