#!/usr/bin/env bash
# Back-translation on Multi30k en->de: a de->en model back-translates in-domain German captions
# (data/multi30k-captions), then en->de trains on real + synthetic pairs; test_2016_flickr scored.
#
#   bash examples/multi30k-bt/run.sh [--minutes N] [--reverse-minutes M] [--out DIR] [--baseline] [--side-by-side] [--bt sample|beam|noise] [--no-tag] [--captions K] [--real-weight W] [--reverse-bt MODEL] [--reverse-flags FLAGS] [--forward-translate MODEL] [--filter F] [--ct2] [--average-last K] [-- NMT_TRAIN_FLAGS]
#
# --minutes N: the training budget of the en->de models (the baseline, the final model).
# --reverse-minutes M: the de->en model's budget (default N).
# --baseline: also train en->de on the real pairs alone for N minutes and score it (the comparison).
# --side-by-side: the baseline and the final model train at the same time, one thread each, so that
#   the equal-minutes comparison runs under equal conditions (on 2 cores, sequential runs meet
#   different loads); implies --baseline, not with --filter (whose forward model is the baseline).
# --ct2: back-translate with CTranslate2 (the de->en model exported, int8): several times faster.
# --average-last K: score (and leave at DIR/model.pt) the average of the last K checkpoints (saved
#   every 50 updates); default 5 for budgets of 20 minutes and more, else 1 (checkpoint_last.pt),
#   as in examples/multi30k/run.sh. The de->en model back-translates with the same rule.
# --bt: how the captions are back-translated: sample (--sampling --topk 10, the default), beam
#   (beam 5), noise (beam 5 plus Edunov et al. 2018's noise). --no-tag: without the <bt> tag.
# --captions K: the first K of the 5 caption files (29,000 lines each; default 1).
# --real-weight W: the real corpus's share of the blend (default 0.5: 1:1 real:synthetic).
# --reverse-bt MODEL: iterative back-translation (Hoang et al. 2018): the de->en model trains on the
#   real pairs plus the English captions back-translated by MODEL, an en->de model such as DIR/model.pt
#   of an earlier run, 1:1 by weight, with the same --bt search and tag as the final model's data.
# --reverse-flags FLAGS: nmt-train flags for the de->en model, one quoted string
#   (e.g. "--lr-scheduler cosine").
# --forward-translate MODEL: forward translation (self-training, He et al. 2020): MODEL, an en->de
#   model such as DIR/model.pt of an earlier run, translates the English captions of the same
#   --captions files (beam 5, no tag: the source is real), and the final model trains on the real
#   pairs (--real-weight W), the back-translation and this, the two synthetic sets (1-W)/2 each.
# --filter F: keep the best fraction F of the synthetic pairs by dual conditional cross-entropy
#   (nmt-filter, the baseline as forward model: implies --baseline).
# Flags after -- go to nmt-train for both en->de models (the baseline and the final model, so the
#   comparison stays equal), not to the de->en model; e.g. -- --encoder-embed-dim 192 ...
# The model the script scored last is left at DIR/model.pt; every score in DIR/scores.tsv. Steps
# whose output exists are skipped, so variants run one after another reuse the de->en model, the
# back-translation and the baseline (another --minutes, --reverse-minutes, --reverse-flags or flags
# after -- over a DIR with trained models is refused). Run from the repository root inside the
# virtual environment.
set -euo pipefail

usage() { sed -n '5p' "$0" | sed 's/^#  *//' >&2; exit 2; }
minutes=5 reverse_minutes= out=runs/multi30k-bt baseline=0 side_by_side=0 bt=sample tag=1 captions=1
real_weight=0.5 filter= ct2=0 average_last= reverse_bt= reverse_flags= forward=
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="${2:?--minutes needs a value}"; shift 2 ;;
        --reverse-minutes) reverse_minutes="${2:?--reverse-minutes needs a value}"; shift 2 ;;
        --side-by-side) side_by_side=1; baseline=1; shift ;;
        --ct2) ct2=1; shift ;;
        --average-last) average_last="${2:?--average-last needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --baseline) baseline=1; shift ;;
        --bt) bt="${2:?--bt needs a value}"; shift 2 ;;
        --no-tag) tag=0; shift ;;
        --captions) captions="${2:?--captions needs a value}"; shift 2 ;;
        --real-weight) real_weight="${2:?--real-weight needs a value}"; shift 2 ;;
        --reverse-bt) reverse_bt="${2:?--reverse-bt needs a value}"; shift 2 ;;
        --reverse-flags) reverse_flags="${2?--reverse-flags needs a value}"; shift 2 ;;
        --forward-translate) forward="${2:?--forward-translate needs a value}"; shift 2 ;;
        --filter) filter="${2:?--filter needs a value}"; baseline=1; shift 2 ;;
        -h|--help) usage ;;
        --) shift; break ;;
        *) echo "examples/multi30k-bt/run.sh: unknown option $1" >&2; usage ;;
    esac
done
case "$bt" in
    sample) search=(--sampling --topk 10 --beam 1) ;;
    beam) search=(--beam 5) ;;
    noise) search=(--beam 5 --source-noise) ;;
    *) echo "examples/multi30k-bt/run.sh: --bt sample|beam|noise, got $bt" >&2; exit 2 ;;
esac
if [ "$side_by_side" = 1 ] && [ -n "$filter" ]; then
    echo "examples/multi30k-bt/run.sh: --side-by-side trains the baseline beside the final model, but --filter needs the baseline first" >&2
    exit 2
fi
require_file() {  # OPTION PATH: PATH, when given, must be a file
    if [ -n "$2" ] && [ ! -f "$2" ]; then
        echo "examples/multi30k-bt/run.sh: $1 $2: no such checkpoint file" >&2
        exit 2
    fi
}
require_file --reverse-bt "$reverse_bt"
require_file --forward-translate "$forward"
reverse_minutes=${reverse_minutes:-$minutes}
hours() { python3 -c "print($1 / 60)"; }
mkdir -p "$out"
# The en->de models are skipped when they exist, so a variant with other nmt-train flags would
# silently score the old ones: the flags are recorded when training starts and must match while
# any en->de checkpoint exists (a run nmt-train refused, e.g. for a mistyped flag, binds nothing).
# Models trained before the record existed had no flags (-- was not an option then).
model_flags= recorded=
[ $# -gt 0 ] && model_flags="$(printf '%q ' "$@")" && model_flags="${model_flags% }"
[ -f "$out/en-de.flags" ] && recorded="$(cat "$out/en-de.flags")"
trained=0
for checkpoint in "$out/baseline/checkpoint_last.pt" "$out"/bt-*-w*/checkpoint_last.pt; do
    if [ -e "$checkpoint" ]; then trained=1; fi
done
if [ "$trained" = 1 ] && [ "$recorded" != "$model_flags" ]; then
    echo "examples/multi30k-bt/run.sh: the en->de models in $out were trained with" \
        "[${recorded:-no flags}] after --, not [${model_flags:-no flags}]: use another --out" >&2
    exit 2
fi
# Likewise what an en->de model translated from the English captions, and the models that learnt
# from it: another --reverse-bt (--forward-translate) model over the same DIR would silently reuse
# them. The record is written once that translation is complete, so a model refused before (the
# wrong direction, say) binds nothing.
model_sum() {  # OPTION MODEL RECORD: MODEL's sha256; exits when RECORD names another model
    local sum
    sum="$(sha256sum "$2" | cut -d' ' -f1)"
    if [ -f "$3" ] && [ "$(cat "$3")" != "$sum" ]; then
        echo "examples/multi30k-bt/run.sh: $out was built with another $1 model than $2" \
            "(sha256 $sum): use another --out" >&2
        exit 2
    fi
    echo "$sum"
}
if [ -n "$reverse_bt" ]; then
    teacher_sum="$(model_sum --reverse-bt "$reverse_bt" "$out/reverse-bt.sha256")"
fi
if [ -n "$forward" ]; then
    forward_sum="$(model_sum --forward-translate "$forward" "$out/forward.sha256")"
fi
# The training budgets likewise, and the de->en model's flags: another --minutes, --reverse-minutes
# or --reverse-flags over the same DIR would silently reuse the models. Models trained before these
# records existed are taken as they are.
refuse_other() {  # MODELS RECORD SETTINGS: exits when RECORD, written as MODELS began, holds others
    if [ -f "$2" ] && [ "$(cat "$2")" != "$3" ]; then
        echo "examples/multi30k-bt/run.sh: $1 in $out: trained with $(cat "$2"), not $3:" \
            "use another --out" >&2
        exit 2
    fi
}
if [ "$trained" = 1 ]; then refuse_other "the en->de models" "$out/en-de.minutes" "--minutes $minutes"; fi
reverse_dir="$out/de-en"
if [ -n "$reverse_bt" ]; then reverse_dir="$out/de-en-ibt"; fi
reverse_record="--reverse-minutes $reverse_minutes --reverse-flags [$reverse_flags]"
if [ -f "$reverse_dir/checkpoint_last.pt" ]; then
    refuse_other "the de->en model" "$reverse_dir.flags" "$reverse_record"
fi
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

train() {  # MINUTES DATA SAVE_DIR [flags]: nmt-train's defaults (the Multi30k recipe)
    local budget="$1" data="$2" save="$3"; shift 3
    nmt-train "$data" --stop-time-hours "$(hours "$budget")" --save-dir "$save" --no-epoch-checkpoints \
        --save-interval-updates 50 --keep-interval-updates 10 --log-file "$save.log" "$@" > /dev/null
}

# The functions that name a model set the array their first argument names to its flags (arrays,
# not echoed words: a path may hold spaces).
weights() {  # ARRAY MINUTES SAVE_DIR: the --path flags of the model a run of MINUTES is scored with
    local -n weights_flags="$1"
    local count="$average_last"
    if [ -z "$count" ]; then
        count=1
        if python3 -c "import sys; sys.exit(not $2 >= 20)"; then count=5; fi
    fi
    if [ "$count" -gt 1 ]; then
        weights_flags=(--path "$3" --average-last "$count")
    else
        weights_flags=(--path "$3/checkpoint_last.pt")
    fi
}

score() {  # NAME: test_2016_flickr, beam 5, cased sacreBLEU and chrF2 into scores.tsv
    local name="$1" checkpoints
    weights checkpoints "$minutes" "$out/$name"
    nmt-eval "$out/data" "${checkpoints[@]}" --split test --beam 5 --output "$out/$name.test.de" \
        > "$out/$name.scores"
    local bleu chrf
    bleu=$(grep -o '^BLEU[^=]*= [0-9.]*' "$out/$name.scores" | awk '{print $NF}')
    chrf=$(grep -o '^chrF2[^=]*= [0-9.]*' "$out/$name.scores" | awk '{print $NF}')
    local updates  # the update count nmt-train's last line reports (the machine may be shared)
    updates=$(grep -o 'reached ([0-9]* updates' "$out/$name.log" | tail -1 | grep -o '[0-9]*')
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$minutes" "${updates:-?}" "$bleu" "$chrf" >> "$out/scores.tsv"
    python3 - "$out/model.pt" "${checkpoints[@]}" <<'PYTHON'
import sys

import torch

from nmt.checkpoint_io import last_checkpoints, load_averaged_checkpoint

target, _, path, *average = sys.argv[1:]
paths = last_checkpoints(path, int(average[1])) if average else [path]
torch.save(load_averaged_checkpoint(paths), target + ".tmp")
PYTHON
    mv "$out/model.pt.tmp" "$out/model.pt"
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
monolingual() {  # LANG DIR: the first --captions caption files of LANG as a monolingual dataset
    if [ ! -f "$2/manifest.json" ]; then
        for k in $(seq 1 "$captions"); do zcat "data/multi30k-captions/train.$k.$1.gz"; done > "$2.$1"
        nmt-preprocess --only-source -s "$1" --trainpref "$2" --spm-model "$spm" --dedup \
            --destdir "$2" > /dev/null
        rm "$2.$1"
    fi
}
mono="$out/mono-$captions"
monolingual de "$mono"

tagging=()
[ "$tag" = 1 ] && tagging=(--tag-source)
generate() {  # MONO NAME FLAGS...: MONO translated into the dataset DIR/NAME (resumable: rerun it)
    local source="$1" dataset="$out/$2"; shift 2
    if [ ! -f "$dataset/manifest.json" ]; then
        log "translating $source into $dataset"
        nmt-eval "$source" "$@" --split train --output-dataset "$dataset" --batch-size 128 \
            2> "$dataset.log"
        grep -o 'translated [0-9]* sentences.*' "$dataset.log" | tee "$dataset.speed" >&2
    fi
}
back_translate() {  # MONO NAME MODEL...: MONO back-translated into DIR/NAME with the --bt search
    generate "$@" "${search[@]}" "${tagging[@]}"
}
exported() {  # ARRAY DIR CHECKPOINTS: the --path flags of CHECKPOINTS (a,b,c: averaged), exported to DIR
    local -n exported_flags="$1"
    if [ ! -f "$2/model.bin" ]; then
        nmt-export "$3" --quantization int8 --output-dir "$2" --force > /dev/null
    fi
    exported_flags=(--path "$2")
}
en_de_model() {  # ARRAY MODEL SHA256: the --path flags an en->de checkpoint translates with (--ct2: its export)
    if [ "$ct2" = 1 ]; then
        exported "$1" "$out/en-de-${3:0:16}-ct2" "$2"
    else
        local -n en_de_flags="$1"
        en_de_flags=(--path "$2")
    fi
}
# (not "$([ "$tag" = 1 ] && echo -tagged)": with --no-tag that substitution fails, and set -e stops)
name="bt-$bt-c$captions"
if [ "$tag" = 1 ]; then name="bt-$bt-tagged-c$captions"; fi
reverse_data=()
if [ -n "$reverse_bt" ]; then
    # The English captions back-translated by an en->de model: the de->en model's synthetic data.
    monolingual en "$out/mono-en-$captions"
    en_de_model teacher "$reverse_bt" "$teacher_sum"
    back_translate "$out/mono-en-$captions" "en-$name" "${teacher[@]}"
    echo "$teacher_sum" > "$out/reverse-bt.sha256"
    reverse_data=(--train-subsets "train,$out/en-$name/train" --subset-weights 0.5,0.5)
    name="$name-ibt"
fi

# The reverse model, then the back-translation (resumable: rerun after an interruption).
if [ ! -f "$reverse_dir/checkpoint_last.pt" ] || [ ! -f "$reverse_dir.done" ]; then
    log "training de->en for $reverse_minutes min"
    read -r -a flags <<< "$reverse_flags"
    echo "$reverse_record" > "$reverse_dir.flags"
    train "$reverse_minutes" "$out/data-de-en" "$reverse_dir" "${reverse_data[@]}" "${flags[@]}"
    touch "$reverse_dir.done"
fi
weights reverse "$reverse_minutes" "$reverse_dir"
if [ "$ct2" = 1 ]; then
    name="$name-ct2"
    checkpoint="$reverse_dir/checkpoint_last.pt"
    if [ "${#reverse[@]}" -gt 2 ]; then
        checkpoint=$(python3 -c "import sys; from nmt.checkpoint_io import last_checkpoints; print(','.join(last_checkpoints(sys.argv[1], int(sys.argv[2]))))" "$reverse_dir" "${reverse[3]}")
    fi
    exported reverse "$reverse_dir-ct2" "$checkpoint"
fi
back_translate "$mono" "$name" "${reverse[@]}"

record_en_de() {  # what the en->de models train with, for the checks at the top
    echo "$model_flags" > "$out/en-de.flags"
    echo "--minutes $minutes" > "$out/en-de.minutes"
}
train_baseline() {
    if [ ! -f "$out/baseline.done" ]; then
        log "training the baseline en->de (real pairs) for $minutes min"
        record_en_de
        train "$minutes" "$out/data" "$out/baseline" "$@"
        touch "$out/baseline.done"
    fi
}

synthetic="$out/$name"
variant=
if [ -n "$filter" ]; then
    train_baseline "$@"
    synthetic="$out/$name-f$filter"
    variant="-f$filter"
    if [ ! -f "$synthetic/manifest.json" ]; then
        log "filtering $out/$name: the best $filter by dual conditional cross-entropy"
        nmt-filter "$out/$name" --forward "$out/baseline/checkpoint_last.pt" \
            --reverse "$out/de-en/checkpoint_last.pt" --keep-fraction "$filter" --destdir "$synthetic" \
            --scores "$out/$name.dcce" > "$out/$name-f$filter.log"
    fi
fi
subsets="train,$synthetic/train"
blend="$real_weight,$(python3 -c "print(round(1 - $real_weight, 6))")"
if [ -n "$forward" ]; then
    # The English captions forward-translated: real source, synthetic target, no tag.
    monolingual en "$out/mono-en-$captions"
    en_de_model forward_model "$forward" "$forward_sum"
    forward_name="ft-c$captions"
    if [ "$ct2" = 1 ]; then forward_name="$forward_name-ct2"; fi
    generate "$out/mono-en-$captions" "$forward_name" "${forward_model[@]}" --beam 5 \
        --synthetic-side target
    echo "$forward_sum" > "$out/forward.sha256"
    subsets="$subsets,$out/$forward_name/train"
    blend="$(python3 -c "w = $real_weight; s = round((1 - w) / 2, 6); print(f'{w},{s},{s}')")"
    variant="$variant-ft"
fi
final="$name$variant-w$real_weight"
train_final() {
    if [ ! -f "$out/$final.done" ]; then
        log "training en->de on $subsets for $minutes min"
        record_en_de
        train "$minutes" "$out/data" "$out/$final" --train-subsets "$subsets" \
            --subset-weights "$blend" "$@"
        touch "$out/$final.done"
    fi
}
if [ "$side_by_side" = 1 ]; then
    OMP_NUM_THREADS=1 train_baseline "$@" &
    baseline_job=$!
    OMP_NUM_THREADS=1 train_final "$@"
    wait "$baseline_job"
elif [ "$baseline" = 1 ]; then
    train_baseline "$@"
    train_final "$@"
else
    train_final "$@"
fi
if [ "$baseline" = 1 ] && ! grep -q "^baseline	" "$out/scores.tsv" 2>/dev/null; then
    score baseline
fi
grep -q "^$final	" "$out/scores.tsv" 2>/dev/null || score "$final"
column -t -s "$(printf '\t')" "$out/scores.tsv" >&2
