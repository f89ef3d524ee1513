import pytest
import torch

from litforge.models.mlp import MLP


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_input_size_follows_the_data(shape):
    net = MLP(input_shape=shape, num_classes=10, hidden_sizes=[32, 16], dropout=0.1)
    assert net.layers[1].in_features == shape[0] * shape[1] * shape[2]
    assert net(torch.randn(4, *shape)).shape == (4, 10)


def test_without_batch_norm_or_hidden_layers():
    net = MLP(input_shape=(1, 4, 4), num_classes=3, hidden_sizes=[], batch_norm=False)
    assert [type(m).__name__ for m in net.layers] == ["Flatten", "Linear"]
