"""The per-direction table of run.sh: the multilingual model's scores beside the bilingual ones.

python3 examples/multi30k-multilingual/table.py OUT en-de de-en ...
"""

from __future__ import annotations

import os
import re
import sys

from nmt.data.text import decode_lines, read_raw_lines
from nmt.eval.language_id import off_target_rate


def scores(path: str) -> dict[str, float]:
    text = open(path, encoding="utf-8").read()
    found = {
        "bleu": float(re.search(r"^BLEU = ([\d.]+)", text, re.M).group(1)),
        "chrf": float(re.search(r"^chrF2 = ([\d.]+)", text, re.M).group(1)),
    }
    off = re.search(r"^off-target ([\d.]+)%", text, re.M)
    if off:
        found["off"] = float(off.group(1))
    return found


def main() -> None:
    out, pairs = sys.argv[1], sys.argv[2:]
    languages = sorted({lang for pair in pairs for lang in pair.split("-")})
    print(
        "| direction | multilingual BLEU | chrF2 | off-target % | bilingual BLEU | chrF2 | off-target % |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for pair in pairs:
        target = pair.split("-")[1]
        multi = scores(os.path.join(out, "multi", f"test.{pair}.scores"))
        bilingual = "- | - | -"  # run.sh --no-bilingual
        if os.path.exists(os.path.join(out, pair, "test.scores")):
            single = scores(os.path.join(out, pair, "test.scores"))
            path = os.path.join(out, pair, f"test.hyp.{target}")
            hypotheses = decode_lines(read_raw_lines(path), path=path, replace_invalid=True).lines
            off = off_target_rate(hypotheses, target, languages=languages)
            bilingual = f"{single['bleu']:.2f} | {single['chrf']:.2f} | {off:.2f}"
        print(
            f"| {pair} | {multi['bleu']:.2f} | {multi['chrf']:.2f} | {multi['off']:.2f} | {bilingual} |"
        )
    zero_shot = os.path.join(out, "multi", "test.de-fr.zero-shot.scores")
    if os.path.exists(zero_shot):
        found = scores(zero_shot)
        print(
            f"| de-fr (zero-shot) | {found['bleu']:.2f} | {found['chrf']:.2f} | {found['off']:.2f} "
            "| - | - | - |"
        )


if __name__ == "__main__":
    main()
