"""A multilayer perceptron over flattened images."""

from collections.abc import Sequence
from math import prod

import torch
from torch import nn

from litforge.errors import UserError


class MLP(nn.Module):
    """`input_shape` (C, H, W) and `num_classes` come from the datamodule, not the config."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden_sizes: Sequence[int] = (256, 256),
        dropout: float = 0.0,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        if not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden_sizes):
            raise UserError(
                f"model.net.hidden_sizes={list(hidden_sizes)}: each entry is a layer's number of "
                f"units, an integer at least 1 ([]: no hidden layer)."
            )
        layers: list[nn.Module] = [nn.Flatten()]
        width = prod(input_shape)
        for hidden in hidden_sizes:
            layers.append(nn.Linear(width, hidden, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm1d(hidden))
            layers.append(nn.ReLU(inplace=True))
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
