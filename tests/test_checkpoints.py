"""Checkpoints are data: what one may build (`checkpoints.trusted_class`: by where a class is
defined), and a fork's own code, with nothing registered, through a whole life: train, kill -9
mid-epoch, resume with `ckpt_path=last`, evaluate, predict."""

import json
import shutil
import signal
import textwrap

import pytest
import torch
from helpers import ROOT, run_script, tiny_run_args

from litforge.checkpoints import trusted_class
from litforge.errors import UserError


@pytest.mark.parametrize(
    "target",
    [
        "torch.optim.AdamW",  # (defined in torch.optim.adamw)
        "torch.optim.lr_scheduler.CosineAnnealingLR",
        "torch.nn.GELU",
        "litforge.models.mlp.MLP",
        "litforge.models.ClassificationModule",
    ],
)
def test_classes_of_torch_building_blocks_and_of_this_project_are_trusted(target):
    cls = trusted_class(target, "x.ckpt: model.net")
    assert isinstance(cls, type) and target.endswith(cls.__qualname__)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("litforge.models.torch.load", None),
        ("litforge.models.classifier.torch.load", "a name through another module"),
        ("torch.nn.modules.module.torch.load", "a name through another module"),
        ("torch.optim.optimizer.torch.serialization.os.system", "a name through another module"),
        ("torch.nn.init.normal_", "no class"),  # a function of a trusted package
        ("litforge.checkpoints.read", "no class"),
        ("pathlib.Path", None),  # a package outside: not even imported
        ("subprocess.Popen", None),
        ("torch.load", None),
        ("litforge.models.NoSuchNet", "not found"),
        ("os", "no module.Class name"),
        ("torch.optim.AdamW.__init__", "no class"),
    ],
)
def test_anything_else_is_refused_in_one_line(target, why):
    with pytest.raises(UserError) as refused:
        trusted_class(target, "x.ckpt: model.optimizer")
    message = str(refused.value)
    assert message.startswith(f"x.ckpt: model.optimizer._target_='{target}' is not allowed")
    assert why is None or f"({why})" in message
    assert "A checkpoint builds only classes defined in this project's packages" in message


def test_no_module_outside_the_trusted_packages_is_imported(monkeypatch):
    import importlib

    imported = []
    real = importlib.import_module
    monkeypatch.setattr(
        importlib, "import_module", lambda name: imported.append(name) or real(name)
    )
    for target in ("json.decoder.JSONDecoder", "torch.hub.load", "xml.dom.minidom.Node"):
        with pytest.raises(UserError, match="is not allowed"):
            trusted_class(target, "x")
    assert imported == []


# A fork's own package: an optimizer, a network of nested configs (its own block, a torch.nn
# activation), and a plain LightningModule that takes only `lr` and `num_classes`.
FORK = {
    "optim.py": '''
        import torch


        class Lion(torch.optim.Optimizer):
            """The sign of a momentum's blend with the gradient."""

            def __init__(self, params, lr=1e-4, betas=(0.9, 0.99)):
                super().__init__(params, {"lr": lr, "betas": betas})

            @torch.no_grad()
            def step(self, closure=None):
                with torch.enable_grad():
                    loss = closure() if closure is not None else None
                for group in self.param_groups:
                    beta1, beta2 = group["betas"]
                    for p in (p for p in group["params"] if p.grad is not None):
                        momentum = self.state[p].setdefault("momentum", torch.zeros_like(p))
                        blend = momentum * beta1 + p.grad * (1 - beta1)
                        p.add_(torch.sign(blend), alpha=-group["lr"])
                        momentum.mul_(beta2).add_(p.grad, alpha=1 - beta2)
                return loss
    ''',
    "nets.py": """
        from torch import nn


        class Block(nn.Module):
            def __init__(self, width, activation):
                super().__init__()
                self.width, self.norm, self.activation = width, nn.LayerNorm(width), activation

            def forward(self, x):
                return self.activation(self.norm(x))


        class Net(nn.Module):
            def __init__(self, input_shape, num_classes, block):
                super().__init__()
                inputs = input_shape[0] * input_shape[1] * input_shape[2]
                self.layers = nn.Sequential(
                    nn.Flatten(), nn.Linear(inputs, block.width), block,
                    nn.Linear(block.width, num_classes),
                )

            def forward(self, x):
                return self.layers(x)
    """,
    "plain.py": """
        import lightning as L
        import torch
        import torch.nn.functional as F
        from torch import nn


        class Plain(L.LightningModule):
            def __init__(self, lr=0.05, num_classes=10):
                super().__init__()
                self.save_hyperparameters()
                self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, num_classes))

            def forward(self, x):
                return self.net(x)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = F.cross_entropy(self(x), y)
                self.log("train/loss", loss)
                return loss

            def validation_step(self, batch, batch_idx):
                x, y = batch
                self.log("val/acc", (self(x).argmax(dim=1) == y).float().mean())

            def test_step(self, batch, batch_idx):
                x, y = batch
                self.log("test/acc", (self(x).argmax(dim=1) == y).float().mean())

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
    """,
}
CASES = {
    "optimizer": ["model.optimizer._target_={pkg}.optim.Lion", "~model.optimizer.weight_decay"],
    "network": [
        "model.net._target_={pkg}.nets.Net",
        "~model.net.hidden_sizes",
        "~model.net.dropout",
        "~model.net.batch_norm",
        "+model.net.block._target_={pkg}.nets.Block",
        "+model.net.block.width=32",
        "+model.net.block.activation._target_=torch.nn.GELU",
    ],
    "plain module": ["model={pkg}", "optimized_metric=val/acc"],
}


@pytest.fixture
def fork_package(tmp_path):
    """The package at the checkout's root, where a fork keeps its own (`<root>/<name>/`), and a
    model config for its module; removed afterwards."""
    name = f"testfork_{abs(hash(str(tmp_path))) % 10**8}"
    package = ROOT / name
    package.mkdir()
    config = ROOT / "conf" / "model" / f"{name}.yaml"
    try:
        (package / "__init__.py").write_text("")
        for file, code in FORK.items():
            (package / file).write_text(textwrap.dedent(code).lstrip())
        config.write_text(f"_target_: {name}.plain.Plain\nlr: 0.05\n")
        yield name
    finally:
        shutil.rmtree(package)
        config.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_forks_own_code_trains_resumes_evaluates_and_predicts_with_nothing_registered(
    tmp_path, idx_data_dir, fork_package, case
):
    from PIL import Image

    run = tmp_path / "run"
    own = [override.format(pkg=fork_package) for override in CASES[case]]
    args = tiny_run_args(idx_data_dir, run, *own, "trainer.max_epochs=2", "logger=csv")
    args += ["callbacks.last_checkpoint.every_n_train_steps=2"]
    kill = ["+callbacks.fault._target_=helpers.SendSignal", "+callbacks.fault.signal=SIGKILL"]
    kill += ["+callbacks.fault.epoch=1", "+callbacks.fault.batch=4"]  # mid-epoch 1
    env = {"PYTHONPATH": str(ROOT / "tests")}
    killed = run_script("train.py", *args, *kill, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] in (12, 14)  # mid-epoch 1

    resumed = run_script("train.py", *args, "ckpt_path=last")
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert f"Resuming from {last}" in output
    assert torch.load(last, weights_only=True)["global_step"] == 20
    trained = json.loads((run / "metrics.json").read_text())
    assert trained["test/acc"] > 0.3

    evaluated = run_script(
        "eval.py",
        "data=mnist",
        f"paths.data_dir={idx_data_dir}",
        f"ckpt_path={last}",
        f"hydra.run.dir={tmp_path / 'eval'}",
        "logger=none",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["test/acc"] == pytest.approx(trained["test/acc"], abs=0.05)

    image = tmp_path / "seven.png"
    Image.new("L", (28, 28), 128).save(image)
    predicted = run_script(
        "predict.py", f"ckpt_path={last}", f"input={image}", f"hydra.run.dir={tmp_path / 'p'}"
    )
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert "seven.png" in (tmp_path / "p" / "predictions.csv").read_text()
