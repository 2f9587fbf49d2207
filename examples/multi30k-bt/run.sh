#!/usr/bin/env bash
# Back-translation on Multi30k en->de: a de->en model back-translates in-domain German captions
# (data/multi30k-captions), then en->de trains on real + synthetic pairs; test_2016_flickr scored.
#
#   bash examples/multi30k-bt/run.sh [--minutes N] [--out DIR] [--baseline] [--bt sample|beam|noise] [--no-tag] [--captions K] [--real-weight W] [--filter F]
#
# --minutes N: the training budget of each model (the de->en model, the baseline, the final model).
# --baseline: also train en->de on the real pairs alone for N minutes and score it (the comparison).
# --bt: how the captions are back-translated: sample (--sampling --topk 10, the default), beam
#   (beam 5), noise (beam 5 plus Edunov et al. 2018's noise). --no-tag: without the <bt> tag.
# --captions K: the first K of the 5 caption files (29,000 lines each; default 1).
# --real-weight W: the real corpus's share of the blend (default 0.5: 1:1 real:synthetic).
# --filter F: keep the best fraction F of the synthetic pairs by dual conditional cross-entropy
#   (nmt-filter, the baseline as forward model: implies --baseline).
# The model the script scored last is left at DIR/model.pt; every score in DIR/scores.tsv. Steps
# whose output exists are skipped, so variants run one after another reuse the de->en model, the
# back-translation and the baseline. Run from the repository root inside the virtual environment.
set -euo pipefail

usage() { sed -n '5p' "$0" | sed 's/^#  *//' >&2; exit 2; }
minutes=5 out=runs/multi30k-bt baseline=0 bt=sample tag=1 captions=1 real_weight=0.5 filter=
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="${2:?--minutes needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --baseline) baseline=1; shift ;;
        --bt) bt="${2:?--bt needs a value}"; shift 2 ;;
        --no-tag) tag=0; shift ;;
        --captions) captions="${2:?--captions needs a value}"; shift 2 ;;
        --real-weight) real_weight="${2:?--real-weight needs a value}"; shift 2 ;;
        --filter) filter="${2:?--filter needs a value}"; baseline=1; shift 2 ;;
        -h|--help) usage ;;
        *) echo "examples/multi30k-bt/run.sh: unknown option $1" >&2; usage ;;
    esac
done
case "$bt" in
    sample) search=(--sampling --topk 10 --beam 1) ;;
    beam) search=(--beam 5) ;;
    noise) search=(--beam 5 --source-noise) ;;
    *) echo "examples/multi30k-bt/run.sh: --bt sample|beam|noise, got $bt" >&2; exit 2 ;;
esac
hours=$(python3 -c "print($minutes / 60)")
mkdir -p "$out"
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

train() {  # DATA SAVE_DIR [flags]: nmt-train's defaults (the Multi30k recipe) for --minutes
    local data="$1" save="$2"; shift 2
    nmt-train "$data" --stop-time-hours "$hours" --save-dir "$save" --no-epoch-checkpoints \
        --log-file "$save.log" "$@" > /dev/null
}

score() {  # NAME CHECKPOINT: test_2016_flickr, beam 5, cased sacreBLEU and chrF2 into scores.tsv
    local name="$1" checkpoint="$2"
    nmt-eval "$out/data" --path "$checkpoint" --split test --beam 5 --output "$out/$name.test.de" \
        > "$out/$name.scores"
    local bleu chrf
    bleu=$(grep -o '^BLEU[^=]*= [0-9.]*' "$out/$name.scores" | awk '{print $NF}')
    chrf=$(grep -o '^chrF2[^=]*= [0-9.]*' "$out/$name.scores" | awk '{print $NF}')
    local updates  # the update count nmt-train's last line reports (the machine may be shared)
    updates=$(grep -o 'reached ([0-9]* updates' "$out/$name.log" | tail -1 | grep -o '[0-9]*')
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$minutes" "${updates:-?}" "$bleu" "$chrf" >> "$out/scores.tsv"
    cp "$checkpoint" "$out/model.pt"
    log "$name: test_2016_flickr BLEU $bleu chrF2 $chrf ($out/model.pt)"
}

# Datasets: en-de with its joint vocabulary; de-en and the captions in the same vocabulary.
if [ ! -f "$out/data/manifest.json" ]; then
    nmt-preprocess -s en -t de --trainpref data/multi30k/train --validpref data/multi30k/val \
        --testpref data/multi30k/test_2016_flickr --destdir "$out/data" > /dev/null
fi
spm="$out/data/spm.model"
if [ ! -f "$out/data-de-en/manifest.json" ]; then
    nmt-preprocess -s de -t en --trainpref data/multi30k/train --validpref data/multi30k/val \
        --spm-model "$spm" --destdir "$out/data-de-en" > /dev/null
fi
mono="$out/mono-$captions"
if [ ! -f "$mono/manifest.json" ]; then
    for k in $(seq 1 "$captions"); do zcat "data/multi30k-captions/train.$k.de.gz"; done > "$out/captions-$captions.de"
    nmt-preprocess --only-source -s de --trainpref "$out/captions-$captions" --spm-model "$spm" \
        --dedup --destdir "$mono" > /dev/null
    rm "$out/captions-$captions.de"
fi

# The reverse model, then the back-translation (resumable: rerun after an interruption).
if [ ! -f "$out/de-en/checkpoint_last.pt" ] || [ ! -f "$out/de-en.done" ]; then
    log "training de->en for $minutes min"
    train "$out/data-de-en" "$out/de-en"
    touch "$out/de-en.done"
fi
name="bt-$bt$([ "$tag" = 1 ] && echo -tagged)-c$captions"
tagging=()
[ "$tag" = 1 ] && tagging=(--tag-source)
if [ ! -f "$out/$name/manifest.json" ]; then
    log "back-translating $mono ($bt)"
    nmt-eval "$mono" --path "$out/de-en/checkpoint_last.pt" --split train --output-dataset "$out/$name" \
        "${search[@]}" "${tagging[@]}" --batch-size 128 2> "$out/$name.log"
    grep -o 'back-translated [0-9]* sentences.*' "$out/$name.log" | tee "$out/$name.speed" >&2
fi

if [ "$baseline" = 1 ]; then
    if [ ! -f "$out/baseline.done" ]; then
        log "training the baseline en->de (real pairs) for $minutes min"
        train "$out/data" "$out/baseline"
        touch "$out/baseline.done"
        score baseline "$out/baseline/checkpoint_last.pt"
    fi
fi

synthetic="$out/$name"
final="$name-w$real_weight"
if [ -n "$filter" ]; then
    synthetic="$out/$name-f$filter"
    final="$name-f$filter-w$real_weight"
    if [ ! -f "$synthetic/manifest.json" ]; then
        log "filtering $out/$name: the best $filter by dual conditional cross-entropy"
        nmt-filter "$out/$name" --forward "$out/baseline/checkpoint_last.pt" \
            --reverse "$out/de-en/checkpoint_last.pt" --keep-fraction "$filter" --destdir "$synthetic" \
            --scores "$out/$name.dcce" > "$out/$name-f$filter.log"
    fi
fi
if [ ! -f "$out/$final.done" ]; then
    log "training en->de on real + $synthetic for $minutes min"
    weights="$real_weight,$(python3 -c "print(round(1 - $real_weight, 6))")"
    train "$out/data" "$out/$final" --train-subsets "train,$synthetic/train" --subset-weights "$weights"
    touch "$out/$final.done"
    score "$final" "$out/$final/checkpoint_last.pt"
fi
column -t -s "$(printf '\t')" "$out/scores.tsv" >&2
