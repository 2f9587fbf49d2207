#!/usr/bin/env bash
# The Multi30k en-de recipe: preprocess, train with nmt-train's defaults for a time (or update)
# budget, average the last checkpoints, translate test_2016_flickr with beam 5 and score it.
#
#   bash examples/multi30k/run.sh [--minutes N | --max-update N] [--out DIR] [--average-last K] [-- nmt-train flags]
#
# --average-last K: default 5 for budgets of 20 minutes or 3,000 updates and more, else 1 (that is
# checkpoint_last.pt alone). Run from the repository root inside the virtual environment
# scripts/main.sh creates. Re-running with the same --out resumes: the dataset is kept, training continues from checkpoint_last.pt
# (--stop-time-hours counts the time of earlier runs too), and a finished run is only evaluated.
set -euo pipefail

usage() { sed -n '5p' "$0" | sed 's/^#  *//' >&2; exit 2; }
minutes=10 max_update=0 out=runs/multi30k average_last=
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="${2:?--minutes needs a value}"; shift 2 ;;
        --max-update) max_update="${2:?--max-update needs a value}"; minutes=0; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --average-last) average_last="${2:?--average-last needs a value}"; shift 2 ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "examples/multi30k/run.sh: unknown option $1" >&2; usage ;;
    esac
done
budget=(--stop-time-hours "$(python3 -c "print($minutes / 60)")")
[ "$max_update" -gt 0 ] && budget=(--max-update "$max_update")
# Measured on val (examples/multi30k/README.md): averaging the last 5 checkpoints helps after 25
# minutes (+0.5 BLEU) and hurts after 12 (-0.6), while the model still improves quickly.
if [ -z "$average_last" ]; then
    average_last=1
    if python3 -c "import sys; sys.exit(not ($minutes >= 20 or $max_update >= 3000))"; then average_last=5; fi
fi
weights=(--path "$out/ckpt/checkpoint_last.pt")
[ "$average_last" -gt 1 ] && weights=(--path "$out/ckpt" --average-last "$average_last")
started=$(date +%s)

# The dataset's manifest is installed last: its presence means a complete dataset.
if [ ! -f "$out/data/manifest.json" ]; then
    nmt-preprocess -s en -t de --trainpref data/multi30k/train --validpref data/multi30k/val \
        --testpref data/multi30k/test_2016_flickr --destdir "$out/data" --overwrite
fi

# nmt-train's defaults are the recipe (examples/multi30k/README.md); the flags here only checkpoint
# (every 50 updates, the newest 10 kept, for the average), log, and score val with BLEU every 3rd
# epoch (greedy) for the curves. Flags after -- come last and win.
nmt-train "$out/data" "${budget[@]}" --save-dir "$out/ckpt" --save-interval-updates 50 \
    --keep-interval-updates 10 --no-epoch-checkpoints --validate-interval 3 --eval-bleu \
    --tensorboard-logdir "$out/tensorboard" --log-file "$out/train.log" "$@"

nmt-plot "$out/tensorboard" -o "$out/curves.png" || echo "nmt-plot failed (pip install -e '.[plot]')" >&2

nmt-eval "$out/data" "${weights[@]}" --split test --beam 5 \
    --score-tokenized-lowercase --output "$out/test.hyp.de" | tee "$out/test.scores"
# The machine may be shared: this job's own CPU seconds over its wall seconds x cores tells.
times > "$out/.times"  # not in a pipeline: a subshell would report its own (empty) children
cpu_seconds=$(tail -1 "$out/.times" | awk '{ for (i = 1; i <= 2; i++) { split($i, part, "m"); total += part[1] * 60 + part[2] } print total }')
wall_seconds=$(( $(date +%s) - started ))
echo "$(basename "$0"): $(( wall_seconds / 60 )) min this run, CPU utilisation $(python3 -c "print(f'{$cpu_seconds / max($wall_seconds, 1) / $(nproc):.0%}')") of $(nproc) cores; test2016 scores in $out/test.scores"
