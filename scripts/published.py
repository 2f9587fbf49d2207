"""Regenerate the figures README.md and examples/*/README.md publish from the results files.

    python scripts/published.py            # rewrite every marked block from results/*.json
    python scripts/published.py --check    # change nothing; exit 1 naming each block that differs
                                           # and each figure typed without a results file
    python scripts/published.py --publish OUT/results.json NAME [--force]
                                           # copy a run's results file and its hypotheses into
                                           # results/NAME.json and results/NAME/

A README marks what it publishes; the text between the markers is generated, never typed:

    <!-- results:NAME -->
    (a table: figures.table of results/NAME.json, then where, when and how it was measured)
    <!-- /results:NAME -->

    ... BLEU <!-- figure:NAME:KEY -->33.47<!-- /figure --> after ...     (one figure, inline)

KEY is a dotted path into the results file's figures (``by_update.2.bleu``: list items by
position), with an optional ``:FORMAT`` (Python's, e.g. ``.3f``; default: integers with thousands
separators, other numbers with 2 decimals), or ``bootstrap-METRIC:BASELINE:SYSTEM[:REFERENCE]``:
the paired bootstrap p-value (sacreBLEU's, 1,000 resamples, its fixed seed) of SYSTEM against
BASELINE, both hypothesis files the results file names, scored against its REFERENCE file
(default ``reference``; one per direction where a results file scores several); METRIC is ``bleu``
or ``chrf``. So a "beats" claim is recomputed from the saved hypotheses each time, never copied.

No figure is typed: both commands also exit 1 naming each measured figure the published files
type into their prose (``FILE:LINE: unbacked figure "TEXT"``), since only a results file can be
re-measured. Prose is what is left outside fenced code blocks, inline code spans, HTML comments,
link targets and the markers above; in it a measured figure is

- a decimal number (``33.47``, ``p = 0.054``; a default too: a setting is written as code,
  ``--dropout 0.1``),
- a ratio (``1.5x``, ``2x``) or a percentage (``95%``, ``0.01%``),
- a number followed by a unit of time, size, speed or progress (``s``, ``ms``, ``min``,
  ``minutes``, ``h``, ``hours``, ``days``, ``MB``, ``GiB``..., ``tok/s``, ``sent/s``, ``req/s``,
  ``upd/s``, ``pairs/s``, ``samples/s``, ``updates``, ``epochs``, ``BLEU``, ``chrF2``) or after a
  metric (``BLEU 33``, ``chrF2 = 55``), ranges included (``1.27-1.73x``, ``+3.03 to +3.35``),
- a table cell that is a number alone (``| 10,300 |``): a table of figures is a results block.

Not figures: whole numbers without a unit (counts, sizes of data, issue numbers, dates, times of
day), versions of three parts or more (``2.13.0``) or after ``Python``, ``torch``, ``CUDA``,
``version`` or ``v`` (``Python >= 3.10``), and digits inside a word (``fp32``, ``chrF2``). The
rule is a net, not a proof: a figure spelled in words passes it.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from nmt.fileio import atomic_write  # noqa: E402
from nmt.results import Results, read_results, save_results  # noqa: E402

BLOCK = re.compile(
    r"<!-- results:(?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.DOTALL
)
OPENING = re.compile(r"<!-- results:([\w.-]+) -->")
FIGURE = re.compile(
    r"<!-- figure:(?P<name>[\w.-]+):(?P<key>[^>]*?) -->(?P<text>.*?)<!-- /figure -->"
)
BOOTSTRAP_SAMPLES = 1000

# What a README may type: everything but a measured figure in its prose (see the module docstring).
_FENCE = re.compile(
    r"^ {0,3}(?P<fence>`{3,}|~{3,}).*?^ {0,3}(?P=fence)[ \t]*$", re.DOTALL | re.MULTILINE
)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
# A code span ends within its paragraph: a stray backtick hides no figure of the next one.
_CODE_SPAN = re.compile(r"(?P<ticks>`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)(?P=ticks)(?!`)", re.DOTALL)
_LINK = re.compile(r"\]\([^)\s]*\)|<?https?://[^\s>)]+>?")
_NUMBER = r"[+\-−±~]?\d+(?:,\d{3})*(?:\.\d+)?"
_UNIT = (
    r"(?:(?:tok(?:ens)?|sent(?:ences)?|req(?:uests)?|upd(?:ates)?|pairs|samples|it)/s"
    r"|[mnuµ]?s|sec|seconds?|min|minutes?|h|hours?|days?|[KMGT]i?B|updates|epochs|BLEU|chrF2?)"
)
_METRIC = r"(?:BLEU|chrF2|chrF\+\+|chrF|TER|COMET)(?:\s*[=:]\s*|\s+)"
_VERSION = r"\d+(?:\.\d+){2,}|(?:Python|CUDA|torch|PyTorch|version|v)\s*(?:[<>=]=?\s*)?\d+\.\d+"
UNBACKED = re.compile(
    rf"(?<![\w.])(?:(?P<version>{_VERSION})"
    rf"|(?P<metric>{_METRIC}{_NUMBER})"
    rf"|(?P<figure>{_NUMBER}(?:\s*(?:-|–|to)\s*{_NUMBER})*"
    rf"(?P<measure>\s*%|(?:x|×)(?!\w)|\s*{_UNIT}(?![\w/]))?))"
)
_TABLE_NUMBER = re.compile(rf"(?<=\|)[ \t]*\**(?P<figure>{_NUMBER})\**[ \t]*(?=\|)")


def published_files(root: str) -> list[str]:
    """README.md and each example's README.md, relative to ``root``."""
    examples = os.path.join(root, "examples")
    names = sorted(
        os.path.join("examples", entry, "README.md")
        for entry in (os.listdir(examples) if os.path.isdir(examples) else [])
        if os.path.isfile(os.path.join(examples, entry, "README.md"))
    )
    return ["README.md", *names]


@dataclass(frozen=True)
class Difference:
    file: str
    line: int
    what: str  # "results:NAME" or "figure:NAME:KEY"

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what} differs from its results file"


def regenerate(root: str, *, write: bool) -> list[Difference]:
    """Every marked block and figure of the published files whose text is not what its results
    file gives; with ``write``, those files are rewritten with the generated text."""
    load = functools.cache(lambda name: _load(root, name))
    differences = []
    for file in published_files(root):
        path = os.path.join(root, file)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        _check_blocks_closed(file, text)
        new, found = _substitute(file, text, load)
        differences += found
        if write and new != text:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(new)
    return differences


@dataclass(frozen=True)
class Unbacked:
    file: str
    line: int
    text: str  # the figure as the README types it

    def __str__(self) -> str:
        return f'{self.file}:{self.line}: unbacked figure "{self.text}"'


def unbacked(root: str) -> list[Unbacked]:
    """Every measured figure the published files type into their prose (``find_unbacked``)."""
    found = []
    for file in published_files(root):
        with open(os.path.join(root, file), encoding="utf-8") as handle:
            found += find_unbacked(file, handle.read())
    return found


def find_unbacked(file: str, text: str) -> list[Unbacked]:
    """The measured figures of ``text`` outside fenced code, code spans, HTML comments, link
    targets and the generated text of marked blocks and figures, in order."""
    prose = text
    for pattern in (_FENCE, BLOCK, FIGURE, _COMMENT, _CODE_SPAN, _LINK):
        # Blanked, not removed: offsets, so line numbers, stay those of ``text``.
        prose = pattern.sub(lambda match: re.sub(r"[^\n]", " ", match[0]), prose)
    hits = {m.start("figure"): m["figure"] for m in _TABLE_NUMBER.finditer(prose)}
    for match in UNBACKED.finditer(prose):
        if match["metric"] or (
            match["figure"] and (match["measure"] or re.search(r"\d\.\d", match["figure"]))
        ):
            hits[match.start()] = match["metric"] or match["figure"]
    return [
        Unbacked(file, prose.count("\n", 0, start) + 1, " ".join(figure.split()))
        for start, figure in sorted(hits.items())
    ]


def _check_blocks_closed(file: str, text: str) -> None:
    closed = {match.start() for match in BLOCK.finditer(text)}
    for match in OPENING.finditer(text):
        if match.start() not in closed:
            line = text.count("\n", 0, match.start()) + 1
            raise ValueError(
                f"{file}:{line}: <!-- results:{match[1]} --> has no <!-- /results:{match[1]} --> after it"
            )


def _substitute(
    file: str, text: str, load: Callable[[str], Results]
) -> tuple[str, list[Difference]]:
    differences: list[Difference] = []

    def figure(match: re.Match, line: int) -> str:
        results = _located(file, line, load, match["name"])
        try:
            value = render_figure(results, match["key"])
        except ValueError as error:
            raise ValueError(f"{file}:{line}: {error}") from None
        if value != match["text"]:
            differences.append(Difference(file, line, f"figure:{match['name']}:{match['key']}"))
        return f"<!-- figure:{match['name']}:{match['key']} -->{value}<!-- /figure -->"

    def block(match: re.Match, line: int) -> str:
        body = render_block(_located(file, line, load, match["name"]))
        if body != match["body"]:
            differences.append(Difference(file, line, f"results:{match['name']}"))
        return f"<!-- results:{match['name']} -->\n{body}<!-- /results:{match['name']} -->"

    text = _replace(FIGURE, figure, text)
    return _replace(BLOCK, block, text), differences


def _replace(pattern: re.Pattern, render: Callable[[re.Match, int], str], text: str) -> str:
    """``pattern.sub`` with each match's line number (of ``text``) given to ``render``."""
    return pattern.sub(lambda match: render(match, text.count("\n", 0, match.start()) + 1), text)


def _located(file: str, line: int, load: Callable[[str], Results], name: str) -> Results:
    try:
        return load(name)
    except (ValueError, OSError) as error:
        raise ValueError(f"{file}:{line}: {error}") from None


def _load(root: str, name: str) -> Results:
    path = os.path.join(root, "results", f"{name}.json")
    if not os.path.isfile(path):
        raise ValueError(f"results/{name}.json: no such results file")
    return read_results(path)


def render_block(results: Results) -> str:
    """The table of ``figures.table`` and one line of provenance, each line ending in a newline."""
    table = results.figures.get("table")
    if not isinstance(table, dict) or "columns" not in table or "rows" not in table:
        raise ValueError(f"{results.path}: figures.table with columns and rows expected")
    lines = [
        _row(table["columns"]),
        _row(["---"] * len(table["columns"])),
        *(_row(row) for row in table["rows"]),
        "",
        provenance(results),
    ]
    return "\n".join(lines) + "\n"


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


def provenance(results: Results) -> str:
    machine = results.machine
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    load = "/".join(str(x) for x in machine.get("load", [])) or "not recorded"
    name = os.path.basename(results.path)
    return (
        f"Measured {results.date[:10]} at revision {results.revision[:12]} on {machine.get('cpu')} "
        f"({machine.get('cores')} cores{gpu}), torch {machine.get('torch')}, load {load}: "
        f"`{shlex.join(results.command)}` (`results/{name}`; `python scripts/published.py` "
        "regenerates this table)."
    )


def render_figure(results: Results, key: str) -> str:
    """The text of one inline figure: ``KEY[:FORMAT]`` or
    ``bootstrap-METRIC:BASELINE:SYSTEM[:REFERENCE]``."""
    if key.startswith("bootstrap-"):
        parts = key[len("bootstrap-") :].split(":")
        if len(parts) not in (3, 4):
            raise ValueError(
                f"figure {key!r}: bootstrap-METRIC:BASELINE:SYSTEM[:REFERENCE] expected"
            )
        return f"{paired_bootstrap_p(results, *parts):.3f}"
    path, _, spec = key.partition(":")
    value = lookup(results, path)
    if spec:
        return format(value, spec)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def lookup(results: Results, path: str) -> Any:
    value: Any = results.figures
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise ValueError(f"{results.path}: no figure {path!r}")
    return value


def paired_bootstrap_p(
    results: Results, metric: str, baseline: str, system: str, reference: str = "reference"
) -> float:
    """sacreBLEU's paired bootstrap p-value of ``system`` against ``baseline`` on ``metric``,
    scored against the hypotheses file named ``reference``."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    metrics = {"bleu": BLEU, "chrf": CHRF}
    if metric not in metrics:
        raise ValueError(f"bootstrap metric {metric!r}: bleu or chrf expected")
    texts = {name: _lines(results, name) for name in (reference, baseline, system)}
    for name in (baseline, system):
        if len(texts[name]) != len(texts[reference]):
            raise ValueError(
                f"{results.hypothesis_path(name)}: {len(texts[name])} lines, the reference has "
                f"{len(texts[reference])}"
            )
    if texts[baseline] == texts[system]:
        # No difference to test. sacreBLEU (after multeval) counts only strictly larger resampled
        # differences, so it would give identical outputs its smallest p-value, 1/(resamples+1).
        return 1.0
    test = PairedTest(
        [(baseline, texts[baseline]), (system, texts[system])],
        {metric: metrics[metric]()},
        references=[texts[reference]],
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    _, scores = test()
    (column,) = (values for name, values in scores.items() if name != "System")
    return float(column[1].p_value)  # [0] is the baseline's own row


def _lines(results: Results, name: str) -> list[str]:
    path = results.hypothesis_path(name)
    try:
        with open(path, encoding="utf-8", newline="\n") as handle:
            return handle.read().split("\n")[:-1]  # one sentence per line: split on \n only
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror}") from None


_NAME = re.compile(r"[\w-][\w.-]*")


def publish(root: str, source: str, name: str, *, force: bool = False) -> Results:
    """Copy the results file ``source`` to results/NAME.json and each hypothesis file it names to
    results/NAME/HYPOTHESES.txt (its paths rewritten to them); what is there already stays unless
    ``force``. The hypotheses are written first, so the results file never names a missing one."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"--publish NAME {name!r}: letters, digits, '_', '-' and '.' only")
    results = read_results(source)
    path = os.path.join(root, "results", f"{name}.json")
    directory = os.path.join(root, "results", name)
    for existing, shown in ((path, f"results/{name}.json"), (directory, f"results/{name}/")):
        if os.path.lexists(existing) and not force:
            raise ValueError(f"{shown}: already published (--force replaces it)")
    if os.path.exists(path) and os.path.samefile(source, path):
        raise ValueError(f"{source}: is results/{name}.json itself")
    copies = {}
    for hypothesis in results.hypotheses:
        if not _NAME.fullmatch(hypothesis):
            raise ValueError(f"{source}: hypotheses name {hypothesis!r} is not a file name")
        original = results.hypothesis_path(hypothesis)
        if not os.path.isfile(original):  # before anything is written: no half publication
            raise ValueError(f"{original}: no such file (hypotheses {hypothesis!r} of {source})")
        copies[hypothesis] = (original, f"{hypothesis}.txt")
    os.makedirs(directory, exist_ok=True)
    for original, copy in copies.values():
        _copy(original, os.path.join(directory, copy))
    published = replace(
        results,
        path=path,
        hypotheses={hypothesis: f"{name}/{copy}" for hypothesis, (_, copy) in copies.items()},
    )
    save_results(published)
    kept = {copy for _, copy in copies.values()}
    for entry in os.listdir(directory):  # a replaced run's hypotheses the new one does not name
        if entry not in kept and os.path.isfile(os.path.join(directory, entry)):
            os.remove(os.path.join(directory, entry))
    return published


def _copy(source: str, destination: str) -> None:
    try:
        reader = open(source, "rb")
    except OSError as error:
        raise ValueError(f"{source}: {error.strerror}") from None
    with reader, atomic_write(destination, "wb") as writer:
        shutil.copyfileobj(reader, writer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="published.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming each block that differs (and, in both modes, each "
        "unbacked figure)",
    )
    parser.add_argument(
        "--publish",
        nargs=2,
        metavar=("RESULTS", "NAME"),
        help="copy a run's results file to results/NAME.json and its hypotheses to results/NAME/",
    )
    parser.add_argument(
        "--force", action="store_true", help="with --publish: replace what NAME published before"
    )
    parser.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.force and not args.publish:
        parser.error("--force goes with --publish")
    if args.publish and args.check:
        parser.error("--publish changes results/: not with --check")
    try:
        if args.publish:
            return _publish_command(args.root, *args.publish, force=args.force)
        differences = regenerate(args.root, write=not args.check)
        figures = unbacked(args.root)
    except (ValueError, OSError) as error:
        print(f"published.py: error: {error}", file=sys.stderr)
        return 1
    for difference in differences:
        print(
            difference
            if args.check
            else f"{difference.file}:{difference.line}: {difference.what} regenerated"
        )
    for figure in figures:
        print(figure)
    if args.check and differences:
        print("published.py: run `python scripts/published.py` to regenerate them", file=sys.stderr)
    if figures:
        print(
            "published.py: publish each figure from a results file (a results or figure marker) "
            "or remove it",
            file=sys.stderr,
        )
    return 1 if figures or (args.check and differences) else 0


def _publish_command(root: str, source: str, name: str, *, force: bool) -> int:
    results = publish(root, source, name, force=force)
    print(
        f"results/{name}.json: published from {source} ({results.date[:10]}, revision "
        f"{results.revision[:12]}) with {len(results.hypotheses)} hypothesis files in "
        f"results/{name}/; `python scripts/published.py` regenerates the READMEs from it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
