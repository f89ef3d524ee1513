"""Pipeline-parallel steps (`strategy.pipeline_parallel_size` > 1): this process's stages of the
network (`parallelize.split`) run by one of torch.distributed.pipelining's schedules.

Each batch is cut into `strategy.microbatches` slices that flow through the stages one after
another, so that all stages work at once after the first few. The schedule runs the backward
pass itself (`strategy.ModelParallelStrategy.training_step`, in place of Lightning's).
Gradients are averaged over the microbatches: a step equals one process accumulating the same
microbatches.

Validation and test run forward only (`schedule.eval`). Only the last stage sees logits and
losses: the module's metrics count nothing on the other stages, and the reductions across
processes add up the right totals; a training step's statistics go from the last stage to the
others (`from_last_stage`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from litforge.model_parallel.parallelize import parallelize

log = logging.getLogger(__name__)

SCHEDULES = {
    "gpipe": ScheduleGPipe,  # all forwards, then all backwards
    "1f1b": Schedule1F1B,  # one forward, one backward: fewer activations held
    "interleaved_1f1b": ScheduleInterleaved1F1B,  # 1F1B over VIRTUAL_STAGES stages a process
}
VIRTUAL_STAGES = 2  # stages per process with interleaved_1f1b (stage s on process s % size)


def num_stages(pipeline_size: int, schedule: str) -> int:
    return pipeline_size * (VIRTUAL_STAGES if schedule == "interleaved_1f1b" else 1)


def own_stages(pipeline_rank: int, pipeline_size: int, schedule: str) -> list[int]:
    """The stage indices this process runs: its rank, and with interleaving every
    `pipeline_size`-th stage after it."""
    return list(range(pipeline_rank, num_stages(pipeline_size, schedule), pipeline_size))


class Stages:
    """This process's stages of `net` and the schedule that runs them with the other processes
    of `mesh["pipeline_parallel"]`."""

    def __init__(
        self,
        net: nn.Module,
        mesh: DeviceMesh,
        schedule: str,
        microbatches: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        device: torch.device,
        compile: bool = False,
    ) -> None:
        pipeline_mesh = mesh["pipeline_parallel"]
        size, rank = pipeline_mesh.size(), pipeline_mesh.get_local_rank()
        self.num_stages = num_stages(size, schedule)
        self.stage_indices = own_stages(rank, size, schedule)
        self.modules = parallelize(net, mesh, compile, self.stage_indices, self.num_stages)
        self.first = 0 in self.stage_indices
        self.last = self.num_stages - 1 in self.stage_indices
        self.schedule_name, self.microbatches, self.loss_fn = schedule, microbatches, loss_fn
        self.group, self.device = pipeline_mesh.get_group(), device
        self._schedules: dict[tuple[str, int], object] = {}
        self._eval_size = 0  # evaluation batches are padded to the first one's (full) size
        self._warned = False
        if not self.last:  # its metrics stay empty by design (the last stage counts)
            warnings.filterwarnings("ignore", message="The ``compute`` method of metric")

    def _schedule(self, mode: str, batch_size: int):
        """One schedule per mode and batch size: a stage learns the shapes it sends and receives
        on its first step (a smaller last training batch gets stages of its own), and torch's
        schedules set themselves up again whenever they switch between training and eval."""
        key = (mode, batch_size)
        if key not in self._schedules:
            stages = [
                PipelineStage(module, index, self.num_stages, self.device, group=self.group)
                for module, index in zip(self.modules, self.stage_indices, strict=True)
            ]
            schedule_class = SCHEDULES[self.schedule_name]
            multi = self.schedule_name == "interleaved_1f1b"
            self._schedules[key] = schedule_class(
                stages if multi else stages[0],
                n_microbatches=self.microbatches,
                loss_fn=self.loss_fn,
            )
        return self._schedules[key]

    def train_step(self, images: torch.Tensor, labels: torch.Tensor):
        """Forward and backward of one batch: (logits, mean loss, labels) on the last stage,
        (None, None, labels) on the others. A batch that the microbatches do not divide (an
        epoch's last) loses its remainder: microbatches must have one shape."""
        usable = len(labels) - len(labels) % self.microbatches
        if usable < len(labels):
            if not self._warned:
                log.info(
                    f"Pipeline: a batch of {len(labels)} is cut to {usable} samples, which "
                    f"{self.microbatches} microbatches divide (said once)."
                )
                self._warned = True
            images, labels = images[:usable], labels[:usable]
        if usable == 0:
            return None, None, labels
        losses: list[torch.Tensor] = []
        output = self._schedule("train", usable).step(
            *((images,) if self.first else ()),
            target=labels if self.last else None,
            losses=losses if self.last else None,
        )
        if not self.last:
            return None, None, labels
        return output, torch.stack(losses).mean(), labels

    def from_last_stage(self, logits: torch.Tensor | None) -> torch.Tensor | None:
        """The last stage's logits (detached; a batch's worth of numbers) on every stage of this
        pipeline, on each one's device."""
        box = [logits.detach().cpu() if logits is not None else None]
        last = torch.distributed.get_global_rank(self.group, self.group.size() - 1)
        torch.distributed.broadcast_object_list(box, src=last, group=self.group)
        return box[0].to(self.device) if box[0] is not None else None

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Logits for a batch (forward only) on the last stage; None on the others. A smaller
        batch (an epoch's last) is padded to the first one's size with copies of its last image,
        whose logits are dropped: one set of stages for all, whatever size each data-parallel
        replica's last batch has."""
        n = len(labels)
        self._eval_size = max(self._eval_size, n + (-n % self.microbatches))
        pad = self._eval_size - n
        if pad:
            images = torch.cat([images, images[-1:].expand(pad, *images.shape[1:])])
            labels = torch.cat([labels, labels[-1:].expand(pad)])
        output = self._schedule("eval", n + pad).eval(
            *((images,) if self.first else ()),
            target=labels if self.last else None,
        )
        return output[:n] if self.last else None
