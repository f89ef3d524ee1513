"""How each network is placed on a device mesh: one function per model, always in the order
tensor parallel → compile → FSDP2 (torchtitan's order).

`strategy=model_parallel` (Lightning's ModelParallelStrategy) builds a 2-D mesh named
`data_parallel` × `tensor_parallel`; `ClassificationModule.configure_model` hands it to
`parallelize`. The networks themselves (`models/mlp.py`, `models/cnn.py`) know nothing of this.
"""

from __future__ import annotations

from collections.abc import Callable

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


def parallelize_mlp(net: MLP, mesh: DeviceMesh, compile: bool) -> None:
    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if tp.size() > 1:
        # Batch norm between the linear layers needs whole feature vectors: each layer's weight
        # is split by output features and its output gathered again (the memory is sharded,
        # the activations are not).
        plan = {
            name: ColwiseParallel(output_layouts=Replicate())
            for name, module in net.layers.named_children()
            if isinstance(module, nn.Linear)
        }
        parallelize_module(net.layers, tp, plan)
    if compile:
        net.compile()
    if dp.size() > 1 or tp.size() == 1:
        for layer in net.layers:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=dp)
        fully_shard(net, mesh=dp)


def parallelize_cnn(net: CNN, mesh: DeviceMesh, compile: bool) -> None:
    tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
    if tp.size() > 1:
        # The head's two linear layers as a Megatron pair: the first split by output features,
        # the second by input features, one all-reduce at the end. Convolutions have no tensor
        # parallel style in torch: the trunk is only FSDP-sharded.
        head = net.head
        first, second = (n for n, m in head.named_children() if isinstance(m, nn.Linear))
        parallelize_module(head, tp, {first: ColwiseParallel(), second: RowwiseParallel()})
    if compile:
        net.compile()
    if dp.size() > 1 or tp.size() == 1:
        fully_shard(net.features, mesh=dp)
        fully_shard(net, mesh=dp)


PARALLELIZE: dict[type[nn.Module], Callable[[nn.Module, DeviceMesh, bool], None]] = {
    MLP: parallelize_mlp,
    CNN: parallelize_cnn,
}


def parallelize(net: nn.Module, mesh: DeviceMesh, compile: bool = False) -> None:
    """Shard `net` in place over `mesh` with the function registered for its class."""
    try:
        function = PARALLELIZE[type(net)]
    except KeyError:
        raise TypeError(
            f"strategy=model_parallel does not know how to shard {type(net).__name__}: add a "
            "parallelize function for it to litforge/parallelize.py."
        ) from None
    function(net, mesh, compile)
