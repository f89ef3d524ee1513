"""`strategy=parameter_server`: servers hold the parameters and the optimizer state, workers push
gradients and pull parameters (litforge/parameter_server/strategy.py). Multi-process runs are
`train.py` subprocesses with a timeout and their own port."""

import json
import re
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import (
    NO_FASHION_MNIST,
    ROOT,
    assert_option_builds,
    compose_config,
    fashion_mnist_dir,
    free_port,
    model_weights,
    run_script,
    run_train_killing,
    tiny_run_args,
    write_idx_dataset,
)

from litforge.checks import check_config
from litforge.errors import UserError
from litforge.parameter_server.strategy import (
    PeerLost,
    Server,
    ServerClient,
    _Channel,
    split_by_size,
)
from litforge.pipeline import evaluate, prepare_run, train


def test_parameters_are_split_across_servers_by_size():
    numels = [100, 5, 60, 40, 3, 1]
    shards = split_by_size(numels, 2)
    assert sorted(i for shard in shards for i in shard) == list(range(6))  # each on one server
    assert sorted(sum(numels[i] for i in shard) for shard in shards) == [
        104,
        105,
    ]  # the largest first, each to the lighter
    assert split_by_size(numels, 1) == [list(range(6))]


def workers_and_a_server(mode: str, max_staleness: int = 0, workers: int = 1):
    """A server (the last rank, in a thread) and the workers' clients, each for one parameter
    that starts at 0, stepped by SGD with lr 1: the server's value after pushes of gradients g
    is -sum(g) (sync: -sum of each round's mean)."""
    size = workers + 1
    store = torch.distributed.HashStore()
    groups = {}

    def join(rank):
        groups[rank] = torch.distributed.ProcessGroupGloo(store, rank, size, timedelta(seconds=30))

    joining = [threading.Thread(target=join, args=(rank,)) for rank in range(size)]
    for thread in joining:
        thread.start()
    for thread in joining:
        thread.join(timeout=30)
    server = Server(_Channel(groups[workers]), 0, list(range(workers)), mode, max_staleness)
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    params = [torch.zeros(1) for _ in range(workers)]
    clients = [ServerClient(_Channel(groups[w]), [workers], [params[w]]) for w in range(workers)]
    clients[0].init_servers(torch.optim.SGD([params[0]], lr=1.0), version=0)
    for client in clients:
        client.pull()
    return clients, params, serving, server


def one_worker_and_a_server(mode: str, max_staleness: int):
    clients, params, serving, _ = workers_and_a_server(mode, max_staleness)
    return clients[0], params[0], serving


def push(client, param, grad: float, every: int = 1) -> float:
    param.grad = torch.tensor([grad])
    client.push([1.0], every)
    return param.item()


def test_an_async_worker_gets_parameters_back_once_they_are_too_stale():
    client, param, serving = one_worker_and_a_server("async", max_staleness=2)
    # Its own pushes age its parameters by one server step each: fresh ones come back with the
    # third push, when they would be 3 steps old.
    seen = [push(client, param, 1.0) for _ in range(6)]
    assert seen == [0.0, 0.0, -3.0, -3.0, -3.0, -6.0]
    client.done()
    serving.join(timeout=30)
    assert not serving.is_alive()


def test_push_every_sends_the_mean_of_that_many_steps():
    client, param, serving = one_worker_and_a_server("sync", max_staleness=0)
    seen = [push(client, param, grad, every=2) for grad in (1.0, 3.0, 2.0, 2.0)]
    assert seen == [0.0, -2.0, -2.0, -4.0]  # one server step per 2 batches, on their mean
    client.done()
    serving.join(timeout=30)


def test_a_sync_worker_that_leaves_mid_round_stops_the_others():
    clients, params, serving, server = workers_and_a_server("sync", workers=2)
    pushed = {}

    def first_pushes():
        try:
            push(clients[0], params[0], 1.0)
        except PeerLost as err:
            pushed["error"] = str(err)

    pushing = threading.Thread(target=first_pushes)
    pushing.start()
    with server.changed:  # its push arrived: the round now waits for worker 1
        assert server.changed.wait_for(lambda: server.arrived == 1, timeout=30)
    clients[1].done()  # worker 1 leaves instead of pushing
    pushing.join(timeout=30)
    assert not pushing.is_alive(), "worker 0 must not wait for a worker that left"
    assert "stopped training: a worker stopped or was lost" in pushed["error"]
    serving.join(timeout=30)
    assert not serving.is_alive()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.devices=1"], "needs more processes than servers: trainer.devices x"),
        (["trainer.devices=3", "strategy.num_servers=3"], "strategy.num_servers=3 needs more"),
        (
            ["trainer.devices=3", "strategy.mode=hogwild"],
            "strategy.mode=hogwild: must be one of: sync, async.",
        ),
        (
            ["trainer.devices=3", "strategy.max_staleness=-1"],
            "strategy.max_staleness=-1: must be >= 0.",
        ),
        (["trainer.devices=3", "strategy.push_every=0"], "strategy.push_every=0: must be > 0."),
        (["trainer.devices=3", "trainer.gradient_clip_val=1"], "trainer.gradient_clip_val is not"),
        (["trainer.devices=3", "trainer.precision=16-mixed"], "16-mixed is not supported"),
        (
            ["trainer.devices=3", "strategy.mode=async", "+trainer.max_time=00:01:00:00"],
            "trainer.max_time is not supported with strategy.mode=async",
        ),
        (
            [
                "trainer.devices=3",
                "strategy.mode=async",
                "callbacks.last_checkpoint.every_n_train_steps=100",
            ],
            "every_n_train_steps is not supported with strategy.mode=async",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_before_launch(tmp_path, overrides, message):
    cfg = compose_config(
        "train", tmp_path, ["strategy=parameter_server", "trainer.accelerator=cpu", *overrides]
    )
    with pytest.raises(UserError, match=re.escape(message)):
        check_config(cfg)
        prepare_run(cfg)


def test_the_config_composes_resolves_and_builds(tmp_path, monkeypatch):
    from hydra.utils import instantiate

    from litforge.parameter_server import ParameterServerStrategy

    monkeypatch.setenv("WANDB_MODE", "disabled")
    # a server and 2 workers: 1 process is refused
    overrides = ["strategy=parameter_server", "trainer.accelerator=cpu", "trainer.devices=3"]
    resolved = assert_option_builds(tmp_path, overrides)
    strategy = instantiate(resolved.strategy)
    assert type(strategy) is ParameterServerStrategy
    assert (strategy.num_servers, strategy.mode, strategy.max_staleness) == (1, "sync", 0)
    assert strategy._timeout.total_seconds() == 30 * 60  # a dead peer does not hang forever


def test_torchrun_restarts_are_refused(tmp_path, monkeypatch):
    # Its groups would meet in the store torchrun's agent keeps across restarts.
    cfg = compose_config("train", tmp_path, ["strategy=parameter_server", "trainer.devices=3"])
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(UserError, match="does not survive torchrun --max-restarts: use"):
        prepare_run(cfg)


def ps_env() -> dict[str, str]:
    return {"MASTER_PORT": str(free_port())}


def final_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


@pytest.mark.slow
def test_sync_steps_equal_ddp_and_its_checkpoint_resumes_and_evaluates(tmp_path, idx_data_dir):
    # Same seed and global batch, no batch norm or dropout (their per-process statistics differ
    # by design), SGD with momentum (optimizer state the servers hold): after 2 epochs of 4
    # steps the weights and the momentum match. The reference is one process on the global
    # batch (1 x 64), trained here in-process: what 2 DDP processes x 32 equal
    # (test_strategies.py::test_two_process_ddp_steps_equal_one_process_steps), without
    # starting them. The parameter-server job (2 workers x 32) stops after the first epoch and
    # resumes from its checkpoint (in the single-device format, so with another number of
    # servers too).
    common = [
        "model.net.batch_norm=false",
        "model.net.dropout=0",
        "model.scheduler=null",  # a cosine schedule would follow each run's max_epochs
        "model.optimizer._target_=torch.optim.SGD",
        "~model.optimizer.weight_decay",
        "+model.optimizer.momentum=0.9",
        "model.optimizer.lr=0.05",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=1",
        "test=false",
    ]
    single = [*common, "data.batch_size=64", "trainer.max_epochs=2"]
    train(compose_config("train", tmp_path / "single", tiny_run_args(idx_data_dir, None, *single)))
    ps_dir = tmp_path / "ps"
    ps = ["strategy=parameter_server", "data.batch_size=32", "trainer.deterministic=true"]
    runs = [  # the resumed job splits the parameters over 2 servers, the first over 1
        ["trainer.devices=3", "trainer.max_epochs=1"],
        ["trainer.devices=4", "strategy.num_servers=2", "trainer.max_epochs=2", "ckpt_path=last"],
    ]
    for run in runs:
        args = tiny_run_args(idx_data_dir, ps_dir, *common, *ps, *run)
        result = run_script("train.py", *args, env=ps_env())
        assert result.returncode == 0, result.stderr[-3000:]
    expected, got = final_state(tmp_path / "single" / "run"), final_state(ps_dir)
    assert got["global_step"] == expected["global_step"] == 8
    for key, value in model_weights(expected["state_dict"]).items():
        torch.testing.assert_close(got["state_dict"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    # The optimizer state in the single-device format: one entry per parameter, by index.
    momentum, reference = (
        {i: s["momentum_buffer"] for i, s in run["optimizer_states"][0]["state"].items()}
        for run in (got, expected)
    )
    parameters = [k for k in expected["state_dict"] if k.startswith("net.")]
    assert list(momentum) == list(reference) == list(range(len(parameters)))
    for index, wanted in reference.items():
        torch.testing.assert_close(momentum[index], wanted, rtol=1e-5, atol=1e-6)
    checkpoint = ps_dir / "checkpoints" / "last.ckpt"
    overrides = [f"ckpt_path={checkpoint}", "data=mnist", f"paths.data_dir={idx_data_dir}"]
    evaluated = evaluate(compose_config("eval", tmp_path / "eval", overrides))  # eval.py's path
    assert evaluated["test/acc"] > 0.5


@pytest.mark.skipif(fashion_mnist_dir() is None, reason=NO_FASHION_MNIST)
@pytest.mark.slow
def test_async_mlp_reaches_85_percent_on_fashion_mnist(tmp_path):
    # Two epochs: what one process (tests/data/test_fashion_mnist.py) and DDP need for it.
    # (The default max_staleness; staleness itself is tested in-process above.)
    run_dir = tmp_path / "run"
    args = [
        "strategy=parameter_server",
        "strategy.mode=async",
        "trainer.devices=3",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=2",
        "data.download=false",
        f"paths.data_dir={ROOT / 'data'}",
        "callbacks.rich_progress_bar=null",
        "extras.print_config=false",
        f"hydra.run.dir={run_dir}",
    ]
    result = run_script("train.py", *args, env=ps_env(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "metrics.json").read_text())["test/acc"] >= 0.85


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "rank", "name"),
    [
        ("sync", 1, "worker rank 1"),
        ("sync", 2, "parameter server 0 (rank 2)"),
    ],
    ids=["sync-worker", "server"],
)
def test_a_lost_process_stops_the_job_with_its_name(tmp_path, idx_data_dir, mode, rank, name):
    # A worker kills itself mid-epoch (helpers.SendSignal).
    fault = [
        "+callbacks.fault._target_=helpers.SendSignal",
        "+callbacks.fault.signal=SIGKILL",
        "+callbacks.fault.epoch=1",
        "+callbacks.fault.batch=5",
        f"+callbacks.fault.rank={rank}",
    ]
    args = tiny_run_args(
        idx_data_dir,
        tmp_path / "run",
        "strategy=parameter_server",
        f"strategy.mode={mode}",
        "trainer.devices=3",
        "trainer.max_epochs=100",  # far from done when the process dies
        "data.batch_size=10",
        *(fault if rank < 2 else []),
    )
    # The server, which runs no callbacks, is killed from here once all are training.
    env = {"PYTHONPATH": str(ROOT / "tests")}
    status, text, children = run_train_killing(
        args, "last.ckpt (epoch 0,", 2 if rank == 2 else None, env={**env, **ps_env()}
    )
    victim = children[rank]
    assert status == 1, text[-3000:]
    assert "Traceback" not in text
    # Rank 0's line names it; a worker that outlived it may add its own ("lost contact").
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert (
        f"error: the process of {name} (pid {victim}) died (killed by SIGKILL), so the job "
        f"stopped. Its own output above says why; to resume, run the same command with "
        f"hydra.run.dir=<its run folder> ckpt_path=last."
    ) in errors, text[-3000:]
    assert all("died" in line or "lost contact" in line for line in errors), errors


@pytest.mark.slow
def test_async_training_goes_on_without_a_lost_worker(tmp_path):
    # Worker 1 of 3 kills itself mid-epoch 1, while the workers step alone; the others finish
    # the epoch, form their group again and train to the end on the data split over the two of
    # them. On enough data for the rest of the run to outlast the 5 s in which Lightning's own
    # launcher would kill the job (ParameterServerStrategy.watched_processes).
    data_dir = write_idx_dataset(tmp_path / "data" / "MNIST" / "raw", n_train=6000).parents[1]
    run_dir, samples = tmp_path / "run", tmp_path / "samples"
    args = tiny_run_args(
        data_dir,
        run_dir,
        "strategy=parameter_server",
        "strategy.mode=async",
        "trainer.devices=4",  # 3 workers and a server
        "trainer.max_epochs=3",
        "data.batch_size=10",
        "+callbacks.fault._target_=helpers.SendSignal",
        "+callbacks.fault.signal=SIGKILL",
        "+callbacks.fault.epoch=1",
        "+callbacks.fault.batch=5",
        "+callbacks.fault.rank=1",
        "+callbacks.samples._target_=helpers.RecordValidationSamples",
        f"+callbacks.samples.directory={samples}",
    )
    env = {"PYTHONPATH": str(ROOT / "tests"), **ps_env()}
    result = run_script("train.py", *args, env=env, timeout=300)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert (
        "worker rank(s) 1 lost: asynchronous training goes on with worker rank(s) 0, 2 (2 of 3)"
        in text
    )
    assert "error:" not in text
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 2
    assert json.loads((run_dir / "metrics.json").read_text())["test/acc"] > 0.9
    # Validation over the whole set (val_size=100) each epoch: split three ways, then two ways
    # from the epoch of the loss on; the lost worker's share is not skipped.
    seen: dict[int, list] = {}
    for file in samples.glob("*.jsonl"):
        for line in file.read_text().splitlines():
            record = json.loads(line)
            seen.setdefault(record["epoch"], []).append(
                (record["rank"], record["world_size"], record["samples"])
            )
    assert {epoch: sorted(ranks) for epoch, ranks in seen.items()} == {
        0: [(0, 3, 34), (1, 3, 33), (2, 3, 33)],
        1: [(0, 2, 50), (1, 2, 50)],
        2: [(0, 2, 50), (1, 2, 50)],
    }
