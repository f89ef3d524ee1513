"""`ClassificationModule`: checkpoints independent of how the network ran (eager or compiled)."""

import json
import os

import pytest
import torch
from helpers import compose_config, predicted_accuracy, run_script, write_idx_dataset

from litforge.models import ClassificationModule
from litforge.pipeline import evaluate

NET = {"_target_": "litforge.models.cnn.CNN", "channels": [4], "hidden_size": 8}
OPTIMIZER = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1}


def make(compile: bool) -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule(NET, [1, 28, 28], 10, OPTIMIZER, compile=compile)


def test_compile_flag_is_not_part_of_the_checkpoint():
    model = make(compile=True)
    assert "compile" not in model.hparams and model.compile_net
    assert set(model.state_dict()) == set(make(compile=False).state_dict())


@pytest.mark.slow
def test_compiled_run_checkpoint_loads_into_eager_eval(tmp_path):
    data_dir = write_idx_dataset(tmp_path / "data" / "mnist", n_train=300, n_test=100).parent
    run_dir = tmp_path / "run"
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    result = run_script(
        "train.py",
        "model=cnn",
        "model.compile=true",
        "model.net.channels=[8]",
        "data=mnist",
        "data.val_size=50",
        f"paths.data_dir={data_dir}",
        "trainer.max_epochs=1",
        f"hydra.run.dir={run_dir}",
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.listdir(tmp_path / "inductor"), "inductor compiled nothing: compile was not used"
    best = next((run_dir / "checkpoints").glob("epoch_*.ckpt"))
    state = torch.load(best, weights_only=True)["state_dict"]
    assert not [key for key in state if "_orig_mod" in key]

    overrides = [f"ckpt_path={best}", "data=mnist", f"paths.data_dir={data_dir}"]
    evaluated = evaluate(compose_config("eval", tmp_path / "eval", overrides))  # eval.py's path
    trained = json.loads((run_dir / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-6)
    # predict.py, export.py and serve.py load it eagerly too
    predicted = predicted_accuracy(best, data_dir / "mnist")
    assert predicted == pytest.approx(trained["test/acc"], abs=1e-6)
