"""Jobs a launcher restarts (litforge.elastic, callbacks.restarts): torchrun after a killed or hung
worker, SLURM after a requeue or a lost node. Each restart resumes from the last checkpoint by
itself (`ckpt_path` defaults to `last` there) and ends where an uninterrupted run ends."""

import os
import re
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import (
    RESUMABLE,
    ROOT,
    SLURM,
    assert_same_run,
    compose_config,
    free_port,
    pythonpath,
    run_in_process,
    tiny_run_args,
    write_idx_dataset,
)

from litforge.elastic import torchrun as restart_store
from litforge.elastic.restarts import Restarts


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("data")
    write_idx_dataset(data / "MNIST" / "raw")
    return data


# --- torchrun ---------------------------------------------------------------------------------


def torchrun(logs: Path, *extra: str, fault: signal.Signals | None = None, data_dir: Path):
    """`torchrun --nproc-per-node=2 --max-restarts=1 train.py ...` (c10d rendezvous, as on a
    cluster); with `fault`, the worker of rank 1 gets that signal after the first checkpoint.
    Returns the exit status, the output, and the run folder."""
    port = free_port()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
        "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=job7", "train.py",
        *tiny_run_args(data_dir, None, *RESUMABLE, "strategy=ddp", "trainer.devices=2",
                       f"paths.log_dir={logs}", *extra),
    ]  # fmt: skip
    agent = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # one process group: all of it can be stopped on a timeout
    )
    lines: list[str] = []

    def read() -> None:
        victim = None
        for line in agent.stdout:
            lines.append(line)
            if fault and "last.ckpt (epoch 0," in line and victim is None:
                victim = worker_pid(agent.pid, local_rank=1)
                os.kill(victim, fault)
                lines.append("FAULT")
            if fault == signal.SIGSTOP and "error: rank 0 lost contact" in line:
                # What torchrun does to a stopped worker too, after waiting 30 s for its
                # SIGTERM to act (its shutdown timeout, which a restart does not shorten).
                os.kill(victim, signal.SIGKILL)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        agent.wait(timeout=300)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            os.killpg(agent.pid, signal.SIGCONT)
        reader.join()
    return agent.returncode, "".join(lines), logs / "train" / "runs" / "torchrun-job7"


def worker_pid(agent: int, local_rank: int) -> int:
    for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
        if f"LOCAL_RANK={local_rank}".encode() in Path(f"/proc/{child}/environ").read_bytes():
            return int(child)
    raise AssertionError(f"torchrun has no worker of local rank {local_rank}")


@pytest.fixture(scope="module")
def uninterrupted_torchrun(tmp_path_factory, data_dir) -> Path:
    status, output, run = torchrun(tmp_path_factory.mktemp("reference"), data_dir=data_dir)
    assert status == 0, output[-3000:]
    assert "No checkpoint in" in output  # ckpt_path=last, nothing to resume yet
    assert "Resuming from" not in output, output[-6000:]  # the reference ran in one go
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "timeout", "why"),
    [
        (signal.SIGKILL, [], "Connection (reset|closed) by peer"),
        # a hung worker: found by the next collective's timeout, then killed by torchrun
        # (gloo words it "Timed out waiting ..." or, in the backward pass, "Application timeout
        # caused pair closure"). The timeout holds for the restarted job too: on a loaded
        # machine its processes may start that far apart.
        (signal.SIGSTOP, ["strategy.timeout.minutes=0.5"], "Timed out|timeout caused pair"),
    ],
    ids=["killed", "hung"],
)
def test_torchrun_restarts_a_lost_worker_and_the_job_ends_as_if_uninterrupted(
    tmp_path, data_dir, uninterrupted_torchrun, fault, timeout, why
):
    status, output, run = torchrun(tmp_path / "logs", *timeout, fault=fault, data_dir=data_dir)
    errors = re.findall(r"error: .*", output)  # a progress bar may precede it on its line
    assert status == 0, "\n".join(errors) + output[-8000:]
    assert "FAULT" in output
    assert f"Resuming from {run / 'checkpoints'}/last.ckpt (epoch " in output
    assert len(errors) == 1, output[-4000:]  # the survivor, in one line; no traceback
    assert errors[0].startswith("error: rank 0 lost contact with the other processes of the job")
    assert re.search(why, errors[0]), errors[0]
    assert "torchrun restarts the job (restart 1 of 1); it resumes by itself." in output
    assert "Traceback" not in output
    assert_same_run(run, uninterrupted_torchrun)


def test_processes_of_each_start_agree_on_a_name_that_no_earlier_start_used():
    # torchrun's agent keeps its store across restarts: keys of the first start stay in it.
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    timeout = timedelta(seconds=20)

    def start(world_size: int, first: int = 0) -> list[str]:
        agreed = [""] * world_size

        def process(rank: int) -> None:
            client = torch.distributed.TCPStore(
                "127.0.0.1", server.port, is_master=False, timeout=timeout
            )
            agreed[rank] = restart_store._agree_on_round(client, rank, world_size, timeout)

        # rank `first` starts first: rank 0 may see a stale hello before the fresh one
        order = [first] + [r for r in range(world_size) if r != first]
        threads = [threading.Thread(target=process, args=(rank,)) for rank in order]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        return agreed

    first = start(3)
    second = start(3, first=0)
    third = start(3, first=2)
    for names in (first, second, third):
        assert len(set(names)) == 1 and names[0], names
    assert len({first[0], second[0], third[0]}) == 3


# --- SLURM ------------------------------------------------------------------------------------


def slurm_job(job: str, args: list[str], env: dict[str, str]) -> tuple[list[int], str]:
    """Both tasks of a SLURM job (`srun` on one node): their exit statuses, their output."""
    tasks = [
        subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=ROOT,
            env={**os.environ, **SLURM, **env, "SLURM_JOB_ID": job, "SLURM_PROCID": str(rank),
                 "SLURM_LOCALID": str(rank), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]  # fmt: skip
    outputs = [task.communicate(timeout=300)[0] for task in tasks]
    return [task.returncode for task in tasks], "".join(outputs)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["SIGUSR1", "SIGKILL"])
def test_a_requeued_slurm_job_resumes_from_its_last_checkpoint(
    tmp_path, data_dir, uninterrupted_torchrun, fault
):
    # Task 0 alone gets the signal (SLURM's reach the tasks at different moments; a kill hits
    # one node). A fake `scontrol` records the requeue; the job is started again under its id.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n')
    (bin_dir / "scontrol").chmod(0o755)
    job = str(free_port())
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": pythonpath(ROOT / "tests"),
        "MASTER_PORT": str(free_port()),  # else Lightning derives it from the job id
    }
    args = tiny_run_args(
        data_dir, None, *RESUMABLE, "strategy=ddp", "trainer.devices=2",
        f"paths.log_dir={tmp_path / 'logs'}",
    )  # fmt: skip
    fault_args = [
        "+callbacks.fault._target_=helpers.SendSignal",
        f"+callbacks.fault.signal={fault}",
        "+callbacks.fault.epoch=1",
        "+callbacks.fault.batch=6",
        "+callbacks.fault.rank=0",
    ]
    run = tmp_path / "logs" / "train" / "runs" / f"slurm-{job}"

    statuses, output = slurm_job(job, [*args, *fault_args], env)
    assert f"No checkpoint in {run / 'checkpoints'} to resume (ckpt_path=last): starting" in output
    assert "Traceback" not in output
    if fault == "SIGUSR1":  # the time-limit warning: both save mid-epoch, requeue, stop
        assert statuses == [143, 143], output[-3000:]
        # signalled after step 32, where the tasks had agreed already: both stop after step 33
        assert "Stopped while training at epoch 1, step 33" in output
        assert f"Requeued SLURM job {job}: it resumes from its last checkpoint." in output
        assert (bin_dir / "calls").read_text() == f"requeue {job}\n"
        resumed_from = "last.ckpt (epoch 1, step 33)"
    else:  # a lost node: the other task stops with one line; back to the epoch's checkpoint
        assert statuses == [-signal.SIGKILL, 1], output[-3000:]
        assert "error: rank 1 lost contact with the other processes of the job" in output
        resumed_from = "last.ckpt (epoch 0, step 25)"

    statuses, output = slurm_job(job, args, env)
    assert statuses == [0, 0], output[-3000:]
    assert f"Resuming from {run / 'checkpoints'}/{resumed_from}" in output
    assert not list(tmp_path.rglob("hpc_ckpt_*")), "Lightning's own requeue checkpoints"
    assert_same_run(run, uninterrupted_torchrun)


@pytest.mark.parametrize(
    ("variables", "default"),
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_MAX_RESTARTS": "0"}, None),
        ({"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_MAX_RESTARTS": "3"}, "last"),
        ({**SLURM, "SLURM_JOB_ID": "12"}, "last"),
        ({**SLURM, "SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "bash"}, None),  # srun --pty bash
    ],
    ids=["plain", "torchrun", "torchrun-restarts", "slurm", "slurm-interactive"],
)
def test_ckpt_path_is_last_where_a_launcher_runs_the_job_again(
    tmp_path, launched, variables, default
):
    launched(**variables)
    cfg = compose_config("train", tmp_path)
    Restarts.prepare_run(cfg)
    assert cfg.ckpt_path == default


def test_torchrun_restarts_without_a_job_name_are_one_line_from_the_cli(tmp_path):
    unnamed = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_MAX_RESTARTS": "1"}
    result = run_in_process("train.py", f"paths.log_dir={tmp_path}", env=unnamed)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: torchrun with --max-restarts needs --rdzv-id=<job name>: it names the run "
        "folder that restarted workers go back to."
    )
    assert not any((tmp_path / "train" / "runs").iterdir())  # the run's folder went
