import pytest
import torch

from litforge.models.cnn import CNN


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_input_channels_and_size_follow_the_data(shape):
    net = CNN(input_shape=shape, num_classes=10, channels=[8, 16], hidden_size=32)
    assert net.features[0].in_channels == shape[0]
    # two 2×2 pools: 28 → 7, 32 → 8
    assert net.head[2].in_features == 16 * (shape[1] // 4) * (shape[2] // 4)
    assert net(torch.randn(2, *shape)).shape == (2, 10)


def test_too_many_blocks_for_the_image_size_is_a_clear_error():
    with pytest.raises(ValueError, match="5 pooling blocks shrink 28×28 images to nothing"):
        CNN(input_shape=(1, 28, 28), num_classes=10, channels=[8] * 5)
