"""nmt -> Hugging Face -> nmt on a trained model: the figures of issue 25, side by side.

    python benchmarks/huggingface.py --checkpoint runs/multi30k/ckpt/checkpoint_last.pt \
        --data runs/multi30k/data [--work /tmp/hf-bench]

Prints (1) the largest |logit difference| between our model, the exported MarianMTModel and the
model imported back, over Multi30k val batches (teacher-forced); (2) test_2016_flickr translated by
``nmt-eval --beam 5`` and by transformers' ``generate(num_beams=5)`` on the export: the share of
identical sentences and both BLEU scores.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import time

import torch
from tqdm import tqdm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(path: str) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the checkpoint's dataset (nmt-preprocess)")
    parser.add_argument("--work", default="/tmp/hf-bench")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=200, help="tokens generated at most")
    parser.add_argument(
        "--limit", type=int, default=0, help="translate the first N test sentences only (0: all)"
    )
    args = parser.parse_args()

    import sacrebleu
    import transformers

    from nmt.checkpoint_io import load_checkpoint
    from nmt.config import ModelConfig
    from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, SentencePieceModel
    from nmt.deploy.huggingface import export_huggingface, import_marian, marian_logits, our_logits
    from nmt.model import build_model

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    hf_dir, back_dir = os.path.join(args.work, "hf"), os.path.join(args.work, "back")
    started = time.perf_counter()
    export_huggingface([args.checkpoint], hf_dir, force=True)
    import_marian(hf_dir, back_dir, force=True)
    print(f"export + import back: {time.perf_counter() - started:.1f} s")

    def load(path: str):
        state = load_checkpoint(path)
        model = build_model(ModelConfig(**state["model_config"])).eval()
        model.load_state_dict(state["model"])
        return model, SentencePieceModel(bytes(state["vocab"]["src_spm"].numpy()))

    ours, spm = load(args.checkpoint)
    back, _ = load(os.path.join(back_dir, "checkpoint.pt"))
    hf_model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)

    src_lines = _lines(os.path.join(REPO, "data/multi30k/val.en.gz"))
    tgt_lines = _lines(os.path.join(REPO, "data/multi30k/val.de.gz"))
    worst = {"nmt vs HF": 0.0, "nmt vs nmt->HF->nmt": 0.0}
    for start in tqdm(range(0, len(src_lines), args.batch_size), desc="val logits"):
        sources = [ids + [EOS_ID] for ids in spm.encode(src_lines[start : start + args.batch_size])]
        targets = [[BOS_ID] + ids for ids in spm.encode(tgt_lines[start : start + args.batch_size])]
        src = torch.full((len(sources), max(map(len, sources))), PAD_ID)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        lengths = torch.tensor([len(ids) for ids in sources])
        prev = torch.full((len(targets), max(map(len, targets))), EOS_ID)
        valid = torch.zeros(prev.shape, dtype=torch.bool)  # real target positions only
        for row, ids in enumerate(targets):
            prev[row, : len(ids)] = torch.tensor(ids)
            valid[row, : len(ids)] = True
        expected = our_logits(ours, src, lengths, prev)[valid]
        worst["nmt vs HF"] = max(
            worst["nmt vs HF"],
            float((marian_logits(hf_model, src, lengths, prev)[valid] - expected).abs().max()),
        )
        worst["nmt vs nmt->HF->nmt"] = max(
            worst["nmt vs nmt->HF->nmt"],
            float((our_logits(back, src, lengths, prev)[valid] - expected).abs().max()),
        )
    for name, value in worst.items():
        print(f"max |logit difference| on {len(src_lines)} val pairs, {name}: {value:.3g}")

    test_src = _lines(os.path.join(REPO, "data/multi30k/test_2016_flickr.en.gz"))
    test_ref = _lines(os.path.join(REPO, "data/multi30k/test_2016_flickr.de.gz"))
    if args.limit:
        test_src, test_ref = test_src[: args.limit], test_ref[: args.limit]
        src_path = os.path.join(args.work, "test.en")
        with open(src_path, "w", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in test_src))
    hyp_path = os.path.join(args.work, "nmt.hyp.de")
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt_cli.eval",
            "--path",
            args.checkpoint,
            "--beam",
            "5",
            "--max-len-a",
            "0",
            "--max-len-b",
            str(args.max_len),
            "--output",
            hyp_path,
        ]
        + (["--input", src_path] if args.limit else [args.data, "--split", "test"]),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    nmt_seconds = time.perf_counter() - started
    with open(hyp_path, encoding="utf-8") as handle:
        nmt_hyps = handle.read().split("\n")[: len(test_src)]
    started = time.perf_counter()
    hf_hyps: list[str] = []
    for start in tqdm(range(0, len(test_src), args.batch_size), desc="HF generate"):
        batch = tokenizer(
            test_src[start : start + args.batch_size], return_tensors="pt", padding=True
        )
        with torch.no_grad():
            output = hf_model.generate(**batch, num_beams=5, max_new_tokens=args.max_len)
        hf_hyps += tokenizer.batch_decode(output, skip_special_tokens=True)
    hf_seconds = time.perf_counter() - started
    identical = sum(a == b for a, b in zip(nmt_hyps, hf_hyps))
    bleu_nmt = sacrebleu.corpus_bleu(nmt_hyps, [test_ref])
    bleu_hf = sacrebleu.corpus_bleu(hf_hyps, [test_ref])
    print(
        f"test_2016_flickr, beam 5: {identical}/{len(test_src)} identical "
        f"({100 * identical / len(test_src):.1f}%); BLEU nmt-eval {bleu_nmt.score:.2f} "
        f"({nmt_seconds:.0f} s), transformers generate {bleu_hf.score:.2f} ({hf_seconds:.0f} s); "
        f"difference {abs(bleu_nmt.score - bleu_hf.score):.2f}"
    )
    print(f"BLEU: cased detokenized sacreBLEU (13a), {len(test_ref)} references")


if __name__ == "__main__":
    main()
