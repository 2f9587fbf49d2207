import contextlib
import glob
import json
import os
import signal
import subprocess
import threading

from ..conftest import TINY_MODEL_FLAGS, run_forked, torchrun_command

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


@contextlib.contextmanager
def process_group(command, *, timeout=300, **popen_kwargs):
    """Popen in its own session, killed whole after ``timeout`` seconds (a watchdog, so a test that
    reads the output line by line cannot hang) and on leaving: ranks hung in a collective after a
    failure never outlive the test."""
    process = subprocess.Popen(command, text=True, start_new_session=True, **popen_kwargs)

    def kill_group():
        # torchrun starts its workers in sessions of their own: kill every descendant too.
        for pid in [process.pid, *_descendants(process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    watchdog = threading.Timer(timeout, kill_group)
    watchdog.start()
    try:
        yield process
    finally:
        watchdog.cancel()
        kill_group()
        process.wait()


def _descendants(pid):
    """Every process below ``pid``, read from /proc."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found.extend(children)
        frontier.extend(children)
    return found
