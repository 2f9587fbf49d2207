import json
import os
import subprocess

from ..helpers import TINY_MODEL_FLAGS, process_group, run_forked, torchrun_command

# The shared tiny model, with dropout on (the invariance and resume tests prove it reproducible).
TINY_MODEL_FLAGS = [*TINY_MODEL_FLAGS, "--dropout", "0.1"]


def train_command(data_dir, save_dir, *extra):
    return [
        "--save-dir",
        str(save_dir),
        "--max-tokens",
        "256",
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--warmup-updates",
        "10",
        "--lr",
        "0.003",
        "--seed",
        "3",
        "--no-epoch-checkpoints",
        "--layout",
        "padded",
        *TINY_MODEL_FLAGS,
        *extra,
    ]


def parse_log(stdout):
    """Per-update training records from --log-format json output."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r for r in records if r["kind"] == "train"]


def run_subprocess(args, *, torchrun_procs=None, timeout=300, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    if torchrun_procs:
        command = torchrun_command("nmt_cli.train", *args, nproc=torchrun_procs)
    else:
        return run_forked("nmt_cli.train", args, env=env, timeout=timeout)
    with process_group(
        command, timeout=timeout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
