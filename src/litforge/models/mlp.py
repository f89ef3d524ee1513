"""A multilayer perceptron over flattened images."""

from collections.abc import Sequence
from math import prod

import torch
from torch import nn

from litforge.settings import Fraction, PositiveInt


class MLP(nn.Module):
    """`input_shape` (C, H, W) and `num_classes` come from the datamodule, not the config."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden_sizes: Sequence[PositiveInt] = (256, 256),  # []: no hidden layer
        dropout: Fraction = 0.0,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
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
