#!/bin/bash
# Counts the bilingual-vs-multilingual branches in nmt/ and cli/ (issue 48 part 1: "the direction
# is the unit"), so the closing note can give the counts before and after by the same patterns.
# Before (main 5114f78, 2026-11-28):
#   \.multilingual\b 10 lines/7 files; languages is (not )?None 15/6; if/else languages 13/5;
#   lang_pairs is (not )?None 4/3; split("-") 11/8; TaggedCorpus 7/2; total 60 lines in 15 files;
#   pipelines: nmt/data/multilingual.py 570 lines, nmt/data/preprocess.py 1189 lines.
set -euo pipefail
cd "$(dirname "$0")/.."
patterns=(
  '\.multilingual\b'
  'languages is (not )?None'
  'if languages\b|if not languages\b|else languages\b'
  'lang_pairs is (not )?None'
  'split\("-"\)'
  'TaggedCorpus'
)
total=0
for p in "${patterns[@]}"; do
  n=$(grep -rnE --include='*.py' -e "$p" nmt cli | wc -l || true)
  f=$(grep -rlE --include='*.py' -e "$p" nmt cli | wc -l || true)
  total=$((total + n))
  printf '%-52s %3d lines %2d files\n' "$p" "$n" "$f"
done
printf '%-52s %3d lines %2d files\n' total "$total" \
  "$(grep -rlE --include='*.py' -e "$(IFS='|'; echo "${patterns[*]}")" nmt cli | wc -l || true)"
wc -l nmt/data/preprocess.py nmt/data/groups.py nmt/data/multilingual.py 2>/dev/null || true
