"""The Optuna search's callback in each job: `OptunaPruning` reports the monitored metric to the
job's trial after every validation epoch and stops training when the study's pruner says so.

conf/hparams_search/*.yaml list it as `callbacks.optuna_pruning`, with `trial: null`. In a search
with a pruner the sweeper (`optuna_sweeper.py`) tells each job its trial by overriding that value,
so the job's command line and `.hydra/overrides.yaml` show it:

    callbacks.optuna_pruning.trial={study_name:'mnist_mlp-1a2b3c4d',storage:'sqlite:///.../optuna.db',trial_id:3,pruner:{_target_:optuna.pruners.MedianPruner,n_warmup_steps:2}}

Outside such a search `trial` stays null and the callback does nothing.

(The leading underscore of this module's name keeps Hydra's plugin scan, which imports every
other module of `hydra_plugins` whenever a command starts, from loading Lightning with it.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L


class OptunaPruning(L.Callback):
    """Report `monitor` to the Optuna trial after each validation epoch and stop training when
    the study's pruner says the trial is hopeless; the sweeper then records the trial as PRUNED.

    `trial`: `study_name`, `storage`, `trial_id` (Optuna's id of the trial in that storage) and
    `pruner` (the search's `hydra.sweeper.pruner`: a `_target_` config, or the pruner Hydra built
    from it when it instantiated this callback). None: no trial to report to.
    """

    def __init__(self, monitor: str, trial: Mapping[str, Any] | None = None) -> None:
        self.monitor, self.trial = monitor, None
        if not trial:
            return
        import optuna
        from hydra.utils import instantiate

        pruner = trial["pruner"]
        study = optuna.load_study(
            study_name=trial["study_name"],
            storage=trial["storage"],
            # The search's pruner decides.
            pruner=instantiate(pruner) if isinstance(pruner, Mapping) else pruner,
        )
        # Optuna's way to reach a trial from another process: the study and the trial's id.
        self.trial = optuna.trial.Trial(study, trial["trial_id"])

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.trial is None or trainer.sanity_checking:
            return
        if self.monitor not in trainer.callback_metrics:
            return
        epoch = trainer.current_epoch
        prune = False
        if trainer.is_global_zero:
            self.trial.report(float(trainer.callback_metrics[self.monitor]), step=epoch)
            prune = self.trial.should_prune()
            if prune:
                self.trial.set_user_attr("pruned_at_epoch", epoch)
                print(f"Optuna pruned trial {self.trial.number} after epoch {epoch}.", flush=True)
        # Every process stops together, as rank 0 decided.
        trainer.should_stop = trainer.should_stop or trainer.strategy.broadcast(prune)
