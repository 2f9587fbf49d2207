"""The language identifier behind nmt-eval's off-target rate and nmt-serve's /detect, measured:
share of each language's Multi30k sentences named right by langid, restricted to the model's
languages (how nmt uses it) and unrestricted (its 97 languages), side by side, with the time per
sentence.

    .venv/bin/python benchmarks/language_id.py                       # val of the four languages
    .venv/bin/python benchmarks/language_id.py --split test_2016_flickr --data ../shared/data/multi30k
"""

from __future__ import annotations

import argparse
import os
import time

from nmt.data.text import decode_lines, read_raw_lines, resolve_text_file
from nmt.eval.language_id import detect
from nmt.results import write_results

LANGUAGES = ("en", "de", "fr", "cs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.path.join(os.path.dirname(__file__), "..", "data", "multi30k"),
        help="directory of SPLIT.LANG(.gz) files",
    )
    parser.add_argument("--split", default="val")
    parser.add_argument("--results", help="also write the table as a results file (nmt.results)")
    args = parser.parse_args()
    print(
        f"{'language':<9} {'sentences':>9} {'among en/de/fr/cs':>18} {'all 97':>8} {'ms/sent':>8}"
    )
    rows = []
    for lang in LANGUAGES:
        path = resolve_text_file(os.path.join(args.data, args.split), lang)
        lines = decode_lines(read_raw_lines(path), path=path, replace_invalid=True).lines
        started = time.perf_counter()
        restricted = detect(lines, languages=LANGUAGES)
        elapsed = time.perf_counter() - started
        unrestricted = detect(lines)
        right = [
            100.0 * sum(found == lang for found, _ in results) / len(lines)
            for results in (restricted, unrestricted)
        ]
        print(
            f"{lang:<9} {len(lines):>9} {right[0]:>17.2f}% {right[1]:>7.2f}% "
            f"{1000 * elapsed / len(lines):>8.2f}"
        )
        rows.append([lang, f"{len(lines):,}", f"{right[0]:.2f}%", f"{right[1]:.2f}%"])
    if args.results:
        among = [float(row[2][:-1]) for row in rows]
        columns = ["language", "sentences", "right among en/de/fr/cs", "right among all 97"]
        write_results(
            args.results,
            figures={
                "right_among_languages": {"min": min(among), "max": max(among)},
                "table": {"columns": columns, "rows": rows},
            },
        )


if __name__ == "__main__":
    main()
