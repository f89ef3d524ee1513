"""A convolutional network: a trunk of conv blocks, average pooling, then a classifier head."""

from collections.abc import Sequence
from typing import Annotated, Literal

import torch
from annotated_types import MinLen
from torch import nn

from litforge.settings import Fraction, PositiveInt


class CNN(nn.Module):
    """`input_shape` (C, H, W) and `num_classes` come from the datamodule, not the config."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        channels: Annotated[Sequence[PositiveInt], MinLen(1)] = (32, 64),
        kernel_size: PositiveInt = 3,
        hidden_size: PositiveInt = 128,
        dropout: Fraction = 0.25,
        activation: Literal["relu", "gelu", "silu"] = "relu",
        pool_size: PositiveInt = 1,
        convs_per_block: PositiveInt = 1,
        mirror_average: bool = False,
    ) -> None:
        super().__init__()
        in_channels, height, width = input_shape
        act = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}[activation]
        blocks: list[nn.Module] = []
        conv_args = {"kernel_size": kernel_size, "padding": kernel_size // 2, "bias": False}
        for out_channels in channels:
            for _ in range(convs_per_block):
                conv = nn.Conv2d(in_channels, out_channels, **conv_args)
                blocks += [conv, nn.BatchNorm2d(out_channels), act()]
                in_channels = out_channels
            blocks.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            # 1: global average pooling, for any image size; larger keeps where features are.
            nn.AdaptiveAvgPool2d(pool_size),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(in_channels * pool_size * pool_size, hidden_size),
            act(),
            nn.Dropout(dropout),
            nn.Linear(hidden_size, num_classes),
        )
        self.mirror_average = mirror_average  # for classes that look alike mirrored

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mirror_average and not self.training:  # test-time augmentation: 2× the cost
            return (self.head(self.features(x)) + self.head(self.features(x.flip(3)))) / 2
        return self.head(self.features(x))
