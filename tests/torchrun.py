"""Run a script under ``torchrun --standalone`` for a test, bounded: a hung rank is reported.

``subprocess.run(..., timeout=)`` kills torchrun alone on a timeout and then waits for its
pipes, which the ranks still hold open: a hung rank hung the test until pytest's own timeout,
with no output. Here the job runs in its own session, its output goes to files, a timeout
kills the whole session, and every rank is started with ``faulthandler`` set to print its
threads' stacks shortly before the deadline — so a hang fails with where each rank waited.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: below pytest's 300 s ``timeout``, so the job's own report is the one a reader sees
DEADLINE = 240.0


def torchrun(
    script: Path | str,
    args: Sequence[str] = (),
    *,
    ranks: int | None = 2,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = DEADLINE,
) -> subprocess.CompletedProcess[str]:
    """Run ``script args`` on ``ranks`` torchrun ranks (``None``: plain python); the result.

    Fails the test (with both output tails) if the job outlives ``timeout`` seconds.
    """
    cmd = [sys.executable, str(script), *args]
    if ranks is not None:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    # every rank prints its stacks (stderr) this long before the deadline if still running
    environ["SHARDPIPES_TEST_STACKS_AFTER"] = str(max(timeout - 30, 1))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        job = subprocess.Popen(
            cmd, cwd=cwd, env=environ, stdout=out, stderr=err, text=True, start_new_session=True
        )
        try:
            code = job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            code = None
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code is None:
        pytest.fail(
            f"{' '.join(cmd[1:])} ran past {timeout:.0f} s and was killed.\n"
            f"--- stdout (tail)\n{stdout[-3000:]}\n--- stderr (tail)\n{stderr[-12000:]}"
        )
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def accelerate_launch(
    script: Path | str, args: Sequence[str] = (), *, processes: int = 2, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script args`` under ``accelerate launch`` on ``processes`` CPU processes.

    ``--multi_gpu`` is accelerate's launcher of torchrun's processes, as ``accelerate
    launch --cpu`` would run one process only. ``ACCELERATE_USE_CPU`` (what ``use_cpu`` in
    accelerate's config sets) makes them its ``MULTI_CPU`` processes: without it, an
    ``Accelerator()`` on a machine without a GPU is ``DistributedType.NO``, each process
    its ``process_index`` 0, while torch.distributed has two ranks.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = ["accelerate.commands.launch", "--multi_gpu", f"--num_processes={processes}",
              "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no",
              f"--main_process_port={port}"]  # fmt: skip
    environ = {"ACCELERATE_USE_CPU": "true"}
    return torchrun("-m", [*launch, str(script), *args], ranks=None, cwd=cwd, env=environ)


def arm_stack_dump() -> None:
    """In a job started by :func:`torchrun`: print every thread's stack if still running late."""
    after = os.environ.get("SHARDPIPES_TEST_STACKS_AFTER")
    if after:
        faulthandler.dump_traceback_later(float(after), exit=False)
