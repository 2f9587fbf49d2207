"""Small random parallel corpora written as text files, for the preprocessing tests."""

import os
import random

WORDS = "the a dog cat runs sits on mat red blue big small house tree man woman child ball".split()
WORTE = "der die das hund katze rennt sitzt auf matte rot blau gross klein haus baum mann frau kind ball".split()


def write_corpus(
    directory, name, src_lines, tgt_lines, *, src_lang="en", tgt_lang="de", ending="\n"
):
    for lang, lines in ((src_lang, src_lines), (tgt_lang, tgt_lines)):
        with open(os.path.join(directory, f"{name}.{lang}"), "wb") as handle:
            handle.write(ending.join(lines).encode("utf-8") + ending.encode())
    return os.path.join(directory, name)


def random_pairs(count, seed):
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(count):
        n = rng.randint(3, 12)
        picks = [rng.randrange(len(WORDS)) for _ in range(n)]
        src.append(" ".join(WORDS[p] for p in picks))
        tgt.append(" ".join(WORTE[p] for p in picks))
    return src, tgt
