import atexit
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

# A model small enough that a few updates take well under a second on 2 cores.
TINY_MODEL_FLAGS = [
    "--encoder-layers",
    "1",
    "--decoder-layers",
    "1",
    "--encoder-embed-dim",
    "32",
    "--decoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "64",
    "--decoder-ffn-embed-dim",
    "64",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--share-all-embeddings",
    "--dropout",
    "0.1",
]


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
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(torchrun_procs),
            "--master_port",
            str(_free_port()),
            "-m",
            "nmt_cli.train",
            *args,
        ]
    else:
        return _zygote().run("nmt_cli.train", args, env=env, timeout=timeout)
    with process_group(
        command, timeout=timeout, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as process:
        stdout, stderr = process.communicate()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


# The zygote: a process that has imported nmt_cli.train (torch, torch._dynamo, nmt) once and forks a
# fresh child per run, which runs the module as `python -m` does. A training run of these tests takes
# well under a second; the imports took ~3 CPU-seconds of every one of them. The child is a process of
# its own (own session, environment, stdout/stderr, exit status, signals); only its imports are done.
# The runs that need a pid or a signal of their own (process_group) and torchrun's ranks start as
# before, so `python -m nmt_cli.train` itself stays tested from a cold start.
_ZYGOTE = """
import json, os, random, runpy, sys
import numpy
import nmt_cli.train  # noqa: F401  (the imports each run would repeat)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid:
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
        continue
    os.setsid()
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        handle = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    handle = os.open(os.devnull, os.O_RDONLY)
    os.dup2(handle, 0)
    os.close(handle)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()  # a fresh process draws its own seeds
    numpy.random.seed()
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)  # exceptions and SystemExit leave as they leave `python -m`
"""


class _Zygote:
    def __init__(self):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # read once, when torch loads OpenMP
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, module, args, *, env, timeout):
        assert env.get("OMP_NUM_THREADS") == "1", "the zygote loaded OpenMP with one thread"
        command = [sys.executable, "-m", module, *args]
        with tempfile.TemporaryDirectory() as directory:
            paths = [os.path.join(directory, name) for name in ("stdout", "stderr")]
            for path in paths:
                open(path, "w").close()
            request = dict(
                module=module,
                args=[str(a) for a in args],
                env=env,
                cwd=os.getcwd(),
                stdout=paths[0],
                stderr=paths[1],
            )
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            pid = json.loads(self.process.stdout.readline())["pid"]
            watchdog = threading.Timer(timeout, lambda: _kill_session(pid))
            watchdog.start()
            try:
                returncode = json.loads(self.process.stdout.readline())["returncode"]
            finally:
                watchdog.cancel()
                _kill_session(pid)  # what the run left behind (DataLoader workers...)
            stdout, stderr = (open(path, encoding="utf-8").read() for path in paths)
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def _kill_session(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_zygotes = []


def _zygote():
    if not _zygotes:
        _zygotes.append(_Zygote())
        atexit.register(_zygotes[0].close)
    return _zygotes[0]


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


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
