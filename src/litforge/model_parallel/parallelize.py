"""How each network is placed on a device mesh: one place per model, always in the order
pipeline split → tensor parallel → compile → FSDP2 (torchtitan's order).

`strategy=model_parallel` (`litforge.model_parallel.ModelParallelStrategy`) builds a mesh named
`pipeline_parallel` × `data_parallel` × `tensor_parallel` (the first only when
`strategy.pipeline_parallel_size` > 1) and hands it to `parallelize` with the module's `net`
before the optimizers are built. The networks themselves (`models/mlp.py`, `models/cnn.py`)
know nothing of this.

A pipeline split keeps a stage's layers where they are and puts `nn.Identity` in place of the
others: parameter names stay the full network's, so the shards of all stages make up exactly the
single-device checkpoint. Each stage runs its blocks through an `nn.Sequential` of the same
layer objects (`litforge.model_parallel.stages` runs the schedule).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from litforge.models.cnn import CNN
from litforge.models.mlp import MLP

Block = list[str]  # paths of submodules that run one after another (`net.get_submodule`)


class Contiguous(nn.Module):
    """A stage's output as one dense block: activations go to the next stage through the
    process group, which sends no strided tensors (channels-last convolutions make them)."""

    def forward(self, x):
        return x.contiguous()


# --- MLP ------------------------------------------------------------------------------------


def blocks_mlp(net: MLP) -> list[Block]:
    """Each hidden layer (linear, batch norm, activation, dropout), then the output layer; the
    flatten goes with the first."""
    blocks: list[Block] = [[]]
    for name, module in net.layers.named_children():
        if isinstance(module, nn.Linear) and any(
            isinstance(net.get_submodule(path), nn.Linear) for path in blocks[-1]
        ):
            blocks.append([])
        blocks[-1].append(f"layers.{name}")
    return blocks


def parallelize_mlp(net: MLP, mesh: DeviceMesh, compile: bool, stages: list[nn.Module]) -> None:
    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if tp.size() > 1:
        # Batch norm between the linear layers needs whole feature vectors: each layer's weight
        # is split by output features and its output gathered again (the memory is sharded,
        # the activations are not).
        plan = {
            name: ColwiseParallel(output_layouts=Replicate())
            for name, module in net.layers.named_children()
            if isinstance(module, nn.Linear)  # a pipeline stage's own layers only
        }
        parallelize_module(net.layers, tp, plan)
    for stage in stages or [net]:
        if compile:
            stage.compile()
        if dp.size() > 1 or tp.size() == 1:
            for layer in stage.modules():
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=dp)
            fully_shard(stage, mesh=dp)


# --- CNN ------------------------------------------------------------------------------------


def blocks_cnn(net: CNN) -> list[Block]:
    """Each convolution block (conv, batch norm, activation per conv; pool), then the head."""
    blocks, block = [], []
    for name, module in net.features.named_children():
        block.append(f"features.{name}")
        if isinstance(module, nn.MaxPool2d):
            blocks, block = [*blocks, block], []
    return [*blocks, ["head"]]


def parallelize_cnn(net: CNN, mesh: DeviceMesh, compile: bool, stages: list[nn.Module]) -> None:
    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if tp.size() > 1 and isinstance(net.head, nn.Sequential):  # not another stage's
        # The head's two linear layers as a Megatron pair: the first split by output features,
        # the second by input features, one all-reduce at the end. Convolutions have no tensor
        # parallel style in torch: the trunk is only FSDP-sharded.
        head = net.head
        first, second = (n for n, m in head.named_children() if isinstance(m, nn.Linear))
        parallelize_module(head, tp, {first: ColwiseParallel(), second: RowwiseParallel()})
    for stage in stages or [net]:
        if compile:
            stage.compile()
        if dp.size() > 1 or tp.size() == 1:
            if not stages:
                fully_shard(net.features, mesh=dp)
            fully_shard(stage, mesh=dp)


# --- a network with a backbone and no plan of its own (a pretrained one) ----------------------


def backbone_units(backbone: nn.Module) -> list[nn.Module]:
    """What FSDP2 gathers at a time: each block of the backbone's sequences of blocks (ResNets'
    `layer1`..`layer4`, ViTs' `blocks`, ConvNeXts' `stages`); its stem and norms go with the
    whole network."""
    return [
        block
        for child in backbone.children()
        if isinstance(child, (nn.Sequential, nn.ModuleList))
        for block in child
        if any(block.children()) and any(p.requires_grad for p in block.parameters())
    ]


def blocks_backbone(net: nn.Module) -> list[Block]:
    """One block: where such a network may be cut into pipeline stages is not known."""
    return [[name for name, _ in net.named_children()]]


def parallelize_backbone(
    net: nn.Module, mesh: DeviceMesh, compile: bool, stages: list[nn.Module]
) -> None:
    """Data parallelism only (FSDP2): which layers could be split for tensor parallelism or
    cut into pipeline stages is known only for the networks above (check_fit refuses both)."""
    if compile:
        net.compile()
    dp = mesh["data_parallel"]
    for block in backbone_units(net.backbone):
        fully_shard(block, mesh=dp)
    fully_shard(net, mesh=dp)


# --- for every model ------------------------------------------------------------------------


def _channels_last_input(conv: nn.Module, args: tuple) -> tuple:
    return (args[0].contiguous(memory_format=torch.channels_last),)


def contiguous_convolutions(net: nn.Module) -> None:
    """FSDP2 shards only contiguous parameters (torch 2.14: "FSDP does not support
    non-contiguous parameters yet"), and `model.channels_last` stores convolution weights as
    NHWC. Such weights go back to the standard layout, and their convolutions get channels-last
    inputs instead: a convolution runs NHWC when its input or its weight is, so the same kernels
    compute the same values."""
    for conv in net.modules():
        if isinstance(conv, nn.Conv2d) and not conv.weight.is_contiguous():
            conv.weight.data = conv.weight.data.contiguous()
            conv.register_forward_pre_hook(_channels_last_input)


PLANS: dict[type[nn.Module], tuple[Callable, Callable]] = {
    MLP: (blocks_mlp, parallelize_mlp),
    CNN: (blocks_cnn, parallelize_cnn),
}


def has_plan(net: nn.Module) -> bool:
    """Whether the network has a plan of its own (tensor and pipeline parallelism too)."""
    return type(net) in PLANS


def plan_for(net: nn.Module) -> tuple[Callable, Callable]:
    """The network's plan; a network with a `backbone` and none of its own: data parallelism."""
    if type(net) in PLANS:
        return PLANS[type(net)]
    if isinstance(getattr(net, "backbone", None), nn.Module):
        return blocks_backbone, parallelize_backbone
    raise TypeError(
        f"strategy=model_parallel does not know how to place {type(net).__name__}: add its "
        "blocks_* and parallelize_* functions to litforge/model_parallel/parallelize.py."
    )


def stage_ranges(num_blocks: int, num_stages: int) -> list[range]:
    """Contiguous runs of blocks, one per stage, as even as they go (earlier stages get the
    extra blocks)."""
    base, extra = divmod(num_blocks, num_stages)
    starts = [s * base + min(s, extra) for s in range(num_stages + 1)]
    return [range(starts[s], starts[s + 1]) for s in range(num_stages)]


def split(net: nn.Module, blocks: list[Block], own: list[int], num_stages: int) -> list[nn.Module]:
    """Keep the blocks of the stages in `own`, put `nn.Identity` in place of all others, and
    return one `nn.Sequential` per owned stage that runs its blocks in order."""
    ranges = stage_ranges(len(blocks), num_stages)
    kept = {path for s in own for b in ranges[s] for path in blocks[b]}
    for block in blocks:
        for path in block:
            if path not in kept:
                net.set_submodule(path, nn.Identity())
    return [
        nn.Sequential(
            *(net.get_submodule(path) for b in ranges[s] for path in blocks[b]), Contiguous()
        )
        for s in own
    ]


def parallelize(
    net: nn.Module,
    mesh: DeviceMesh,
    compile: bool = False,
    own_stages: list[int] | None = None,
    num_stages: int = 1,
) -> list[nn.Module]:
    """Place `net` on `mesh` in place, with the functions registered for its class. With
    `num_stages` > 1: first keep only the stages in `own_stages` (returned, in order, for the
    schedule); else returns []."""
    blocks_of, place = plan_for(net)
    contiguous_convolutions(net)
    stages: list[nn.Module] = []
    if num_stages > 1:
        stages = split(net, blocks_of(net), own_stages, num_stages)
    place(net, mesh, compile, stages)
    return stages


def count_blocks(net: nn.Module) -> int:
    """How many pipeline stages `net` can be split into at most."""
    blocks_of, _ = plan_for(net)
    return len(blocks_of(net))
