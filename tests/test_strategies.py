"""`strategy=`: DDP on CPU (gloo), gradient compression, multi-node launchers, and the checks that
refuse what cannot run before anything launches. Multi-process runs are `train.py` subprocesses
with a timeout and their own port (never DDP inside pytest)."""

import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch
from helpers import (
    ROOT,
    assert_dead_rank_named,
    compose_config,
    free_port,
    model_weights,
    run_in_process,
    run_script,
    tiny_run_args,
)
from omegaconf import OmegaConf

from litforge.checks import check_strategy
from litforge.errors import UserError


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy=fsdp", "trainer.accelerator=cpu"], "strategy=fsdp needs GPUs"),
        (["trainer.sync_batchnorm=true", "trainer.accelerator=cpu"], "sync_batchnorm=true works"),
    ],
)
def test_impossible_combinations_are_refused_before_launch(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        check_strategy(compose_config("train", tmp_path, overrides))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a GPU-less machine")
def test_more_gpus_than_exist_is_refused(tmp_path):
    cfg = compose_config("train", tmp_path, ["trainer.accelerator=gpu", "trainer.devices=4"])
    with pytest.raises(
        UserError,
        match="trainer.accelerator=gpu with trainer.devices=4, but this machine has 0 GPU",
    ):
        check_strategy(cfg)


def test_fsdp_on_cpu_is_one_line_from_the_cli(tmp_path):
    result = run_in_process(
        "train.py", "strategy=fsdp", "trainer.accelerator=cpu", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: strategy=fsdp needs GPUs")
    assert "strategy=model_parallel" in result.stderr  # feature: model_parallel


def ddp_env() -> dict[str, str]:
    return {"MASTER_PORT": str(free_port())}


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_writes_one_run_that_eval_loads(tmp_path, idx_data_dir):
    # ddp_bf16: DDP with a gradient-compression hook (test_every_strategy_config_builds_its_
    # strategy checks each option's hook; attaching them is one code path, checked here).
    run_dir = tmp_path / "run"
    result = run_script(
        "train.py",
        *tiny_run_args(idx_data_dir, run_dir),
        "strategy=ddp_bf16",
        "trainer.devices=2",
        "trainer.precision=bf16-mixed",
        "trainer.gradient_clip_val=1.0",
        "trainer.accumulate_grad_batches=2",
        "strategy.timeout.minutes=2",
        env=ddp_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert (
        "Batch size: 50 per process x 2 data-parallel process(es) x 2 accumulated = 200" in output
    )
    # Read back from the wrapped DDP module itself (its logging data), not from our config.
    assert "DDP gradient communication hook attached: bf16_compress_hook" in output
    assert "sync_dist=True" not in output, "Lightning's advice for values synced already"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "run"]  # no stray run dirs
    assert (run_dir / ".hydra").is_dir() and (run_dir / "metrics.json").is_file()
    assert {"train.log", "train_ddp_process_1.log"} <= {p.name for p in run_dir.iterdir()}
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    evaluated = run_in_process(
        "eval.py",
        f"ckpt_path={best}",
        "data=mnist",
        f"paths.data_dir={idx_data_dir}",
        f"hydra.run.dir={tmp_path / 'e'}",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    trained = json.loads((run_dir / "metrics.json").read_text())
    # 200 test images split over 2 processes without padding: the same images as on one
    assert json.loads((tmp_path / "e" / "metrics.json").read_text())["test/acc"] == pytest.approx(
        trained["test/acc"], abs=1e-6
    )


@pytest.mark.slow
def test_a_nan_loss_on_one_process_stops_every_process_before_a_checkpoint(tmp_path, idx_data_dir):
    """Rank 1's loss is NaN at step 5: the averaged gradients make every process's weights NaN,
    so the checkpoint due at step 6 is refused on every process, not written by rank 0."""
    run_dir = tmp_path / "run"
    args = [*tiny_run_args(idx_data_dir, run_dir, "data.batch_size=10"), "trainer.devices=2"]
    args += ["strategy=ddp", "model._target_=helpers.NaNOnRankOne", "strategy.timeout.minutes=2"]
    args += ["callbacks.last_checkpoint.every_n_train_steps=6"]
    result = run_script("train.py", *args, env={**ddp_env(), "PYTHONPATH": str(ROOT / "tests")})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "the training loss became NaN or infinite" in output
    assert not list((run_dir / "checkpoints").glob("*.ckpt")), "no checkpoint after the NaN"


@pytest.mark.slow
def test_two_process_ddp_steps_equal_one_process_steps(tmp_path, idx_data_dir):
    # Same seed, same global batch (2 x 32 vs 1 x 64), no batch norm or dropout (their
    # per-process statistics differ by design): the weights after N steps must match.
    common = [
        "model.net.batch_norm=false",
        "model.net.dropout=0",
        "model.scheduler=null",
        "model.optimizer._target_=torch.optim.SGD",
        "~model.optimizer.weight_decay",
        "model.optimizer.lr=0.1",
        "trainer.limit_train_batches=4",
        "trainer.deterministic=true",
        "trainer.limit_val_batches=1",
        "test=false",
    ]
    weights = {}
    for name, extra, run in [
        ("ddp", ["strategy=ddp", "trainer.devices=2", "data.batch_size=32"], run_script),
        ("single", ["data.batch_size=64"], run_in_process),
    ]:
        run_dir = tmp_path / name
        args = tiny_run_args(idx_data_dir, run_dir, *common, *extra)
        result = run("train.py", *args, env=ddp_env())
        assert result.returncode == 0, result.stderr[-3000:]
        state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        weights[name] = state
        assert (
            torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
        )
    for key, value in model_weights(weights["single"]).items():
        torch.testing.assert_close(weights["ddp"][key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_powersgd_hook_is_attached_on_cpu(tmp_path, idx_data_dir):
    # PowerSGD, the hook with state of its own (ddp_bf16's is in the test above).
    args = tiny_run_args(
        idx_data_dir,
        tmp_path / "run",
        "strategy=ddp_powersgd",
        "trainer.devices=2",
        "trainer.limit_train_batches=3",
        "test=false",
    )
    result = run_script("train.py", *args, env=ddp_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "DDP gradient communication hook attached: powerSGD_hook" in result.stdout + result.stderr
    )


@pytest.mark.slow
def test_two_node_torchrun_on_localhost_shares_one_run_dir(tmp_path, idx_data_dir):
    port = free_port()
    args = tiny_run_args(
        idx_data_dir,
        None,  # the folder is pinned by the job id
        "strategy=ddp",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        f"paths.log_dir={tmp_path / 'logs'}",
    )
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={rank}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "--rdzv-id=job42",
                "train.py",
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:]
    runs = list((tmp_path / "logs" / "train" / "runs").iterdir())
    assert [r.name for r in runs] == ["torchrun-job42"]
    assert (runs[0] / "metrics.json").is_file()


@pytest.mark.slow
def test_simulated_slurm_job_runs_both_tasks_into_the_job_folder(tmp_path, idx_data_dir):
    job_id = str(20000 + free_port() % 9000)  # Lightning derives the port from the job id
    args = tiny_run_args(
        idx_data_dir,
        None,  # the folder is pinned by the job id
        "strategy=ddp",
        "trainer.devices=2",
        f"paths.log_dir={tmp_path / 'logs'}",
    )
    slurm = {
        "SLURM_JOB_ID": job_id,
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "litforge",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_JOB_NUM_NODES": "1",
    }
    tasks = [
        subprocess.Popen(
            [sys.executable, "train.py", *args],
            cwd=ROOT,
            env={**os.environ, **slurm, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in (0, 1)
    ]
    outputs = [task.communicate(timeout=300)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], "\n---\n".join(o[-2500:] for o in outputs)
    runs = [r.name for r in (tmp_path / "logs" / "train" / "runs").iterdir()]
    assert runs == [f"slurm-{job_id}"]


HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
EXPECTED_STRATEGIES = {
    # option: (class, settings read back from the built strategy)
    "ddp": ("litforge.strategies.DDPStrategy", {"_start_method": "popen", "comm_hook": None}),
    "ddp_spawn": ("litforge.strategies.DDPStrategy", {"_start_method": "spawn"}),
    "ddp_fork": ("litforge.strategies.DDPStrategy", {"_start_method": "fork"}),
    "ddp_fp16": ("litforge.strategies.DDPStrategy", {"hook": "fp16_compress_hook"}),
    "ddp_bf16": ("litforge.strategies.DDPStrategy", {"hook": "bf16_compress_hook"}),
    "ddp_powersgd": ("litforge.strategies.DDPStrategy", {"hook": "powerSGD_hook", "rank": 1}),
    "fsdp": ("lightning.pytorch.strategies.fsdp.FSDPStrategy", {"sharding": "FULL_SHARD"}),
}


def test_every_strategy_option_is_listed_here():
    # The others come with a feature folder (litforge.<feature>), whose tests build them.
    for path in (ROOT / "conf" / "strategy").glob("*.yaml"):
        if path.stem not in {"auto", *EXPECTED_STRATEGIES}:
            target = OmegaConf.load(path)._target_
            assert target.startswith("litforge.") and not target.startswith("litforge.strategies")


@pytest.mark.parametrize("name", sorted(EXPECTED_STRATEGIES))
def test_every_strategy_config_builds_its_strategy(tmp_path, name):
    from hydra.utils import get_class, instantiate

    strategy = instantiate(compose_config("train", tmp_path, [f"strategy={name}"]).strategy)
    cls, settings = EXPECTED_STRATEGIES[name]
    assert type(strategy) is get_class(cls)
    assert strategy._timeout.total_seconds() == 30 * 60  # a dead peer does not hang forever
    for key, value in settings.items():
        if key == "hook":
            assert strategy.comm_hook.__name__ == value
            assert strategy.comm_hook.__module__.startswith(HOOKS)
        elif key == "rank":
            assert strategy.comm_state.matrix_approximation_rank == value
        elif key == "sharding":
            assert strategy.sharding_strategy.name == value
            policy = strategy.kwargs["auto_wrap_policy"]  # layer classes become FSDP units
            assert {torch.nn.Linear, torch.nn.Conv2d} <= set(policy._module_classes)
        else:
            assert getattr(strategy, key) == value, key


@pytest.mark.slow
def test_a_dead_rank_stops_the_job_with_its_name(tmp_path, idx_data_dir):
    assert_dead_rank_named(tmp_path, idx_data_dir, "strategy=ddp")


def test_the_process_killed_is_named_before_one_that_exited_on_losing_it():
    # A peer that loses contact exits 1 within moments: the line names the killed process even
    # when that one comes later in rank order.
    from types import SimpleNamespace

    from litforge.strategies import DDPStrategy

    exited = subprocess.Popen(["false"])
    killed = subprocess.Popen(["sleep", "60"])
    killed.kill()
    exited.wait()
    killed.wait()
    strategy = DDPStrategy()
    strategy._launcher = SimpleNamespace(procs=[exited, killed])  # ranks 1 and 2
    assert strategy.lost_process(RuntimeError("Connection reset by peer")).startswith(
        f"the process of rank 2 (pid {killed.pid}) died (killed by SIGKILL), so the job stopped"
    )


def test_a_killed_process_is_logged_the_moment_it_dies(caplog):
    # Lightning's watch may SIGKILL the job before the surviving process has ended it in its
    # line: the first death by a signal is logged at once. Not logged: an exit with a status of
    # its own (that process said why), a SIGTERM (asked to stop), the deaths after the first.
    from types import SimpleNamespace

    from litforge.strategies import DDPStrategy

    def watch(strategy, process: subprocess.Popen, end=None) -> None:
        watching = threading.Thread(target=strategy._watch, args=(process,))
        watching.start()
        if end:
            end()
        watching.join(timeout=30)
        assert not watching.is_alive()

    processes = [subprocess.Popen(["sleep", "60"]) for _ in range(3)] + [subprocess.Popen("false")]
    stopped, killed, killed_after, exited = processes
    strategy = DDPStrategy()
    strategy._launcher = SimpleNamespace(procs=processes)  # ranks 1 to 4
    try:
        with caplog.at_level(logging.ERROR, logger="litforge.strategies"):
            watch(strategy, exited)
            watch(strategy, stopped, stopped.terminate)
            watch(strategy, killed, killed.kill)
            watch(strategy, killed_after, killed_after.kill)
        assert [r.getMessage() for r in caplog.records] == [
            f"The process of rank 2 (pid {killed.pid}) died (killed by SIGKILL): the job stops."
        ]
    finally:
        for process in processes:
            process.kill()
            process.wait()


@pytest.mark.parametrize("lost", [True, False])
def test_torchruns_sigterm_waits_for_the_lost_process_line(lost):
    # torchrun SIGTERMs the survivors when a worker dies; one arriving after Lightning has put
    # back the handler it found must not kill the process before its line.
    script = """
import os, signal, sys
from litforge.strategies import DDPStrategy, lost_process_ends_the_job
strategy = DDPStrategy()
strategy.lost_line = sys.argv[1] or None  # as on_exception sets it
try:
    with lost_process_ends_the_job(strategy):
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, after Lightning's teardown
        print("after SIGTERM", flush=True)
        raise RuntimeError("an error")
except Exception as err:
    print(f"error: {err}", flush=True)
"""
    line = "rank 0 lost contact with the other processes of the job" if lost else ""
    result = subprocess.run(
        [sys.executable, "-c", script, line], capture_output=True, text=True, timeout=120
    )
    if lost:
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["after SIGTERM", f"error: {line}"]
    else:  # as without the handler: the process is terminated
        assert result.returncode == -signal.SIGTERM and result.stdout == "", result.stderr


def test_a_sigterm_handler_of_your_own_is_still_called_during_fit():
    # Lightning calls the SIGTERM handler it finds after its own: the one around fit passes
    # the signal on to the handler that was there before it (a cluster tool's, a fork's).
    script = """
import os, signal
from litforge.strategies import DDPStrategy, lost_process_ends_the_job
signal.signal(signal.SIGTERM, lambda *_: print("your handler", flush=True))
with lost_process_ends_the_job(DDPStrategy()):
    found = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *a: (print("Lightning's", flush=True), found(*a)))
    os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, found)  # Lightning's teardown
print("after fit:", signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None), flush=True)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "Lightning's",
        "your handler",
        "your handler",
        "after fit: None",
    ]


def test_a_lost_peer_is_named_from_the_error_alone():
    # torchrun's SIGTERM can cut Lightning's own handling of the error short, before the
    # strategy's on_exception: pipeline.fit asks the strategy about the error itself.
    from litforge.strategies import DDPStrategy

    gloo = RuntimeError(
        "[/x/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:9604: Connection reset by "
        "peer. This is typically caused by a remote worker hanging."
    )
    assert DDPStrategy().lost_process(gloo) == (
        "rank 0 lost contact with the other processes of the job (Read error "
        "[127.0.0.1]:9604: Connection reset by peer); one of them stopped or died: to resume, "
        "run the same command with hydra.run.dir=<its run folder> ckpt_path=last."
    )
    hung = RuntimeError("Application timeout caused pair closure")  # gloo, in the backward pass
    assert (
        DDPStrategy()
        .lost_process(hung)
        .startswith(
            "rank 0 lost contact with the other processes of the job (Application timeout caused "
            "pair closure); one of them stopped or died"
        )
    )
    assert DDPStrategy().lost_process(ValueError("a bug")) is None
