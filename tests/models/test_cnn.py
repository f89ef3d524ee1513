import pytest
import torch

from litforge.models.cnn import CNN


def parameters(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (3, 224, 224)])
def test_input_channels_and_size_follow_the_data(shape):
    net = CNN(input_shape=shape, num_classes=10, channels=[8, 16], hidden_size=32)
    assert net.features[0].in_channels == shape[0]
    assert net(torch.randn(2, *shape)).shape == (2, 10)


def test_global_pooling_keeps_the_network_the_same_size_at_any_image_size():
    small, large = (CNN((3, size, size), 10) for size in (32, 224))
    assert parameters(small) == parameters(large) < 50_000
    # A coarse map instead: pool_size² times the head's inputs, still independent of the size.
    assert parameters(CNN((3, 224, 224), 10, pool_size=3)) == parameters(
        CNN((3, 96, 96), 10, pool_size=3)
    )


def test_pool_size_keeps_where_features_are():
    net = CNN(input_shape=(1, 28, 28), num_classes=10, channels=[8, 16], pool_size=3)
    head = [m for m in net.head if isinstance(m, torch.nn.Linear)][0]
    assert head.in_features == 16 * 3 * 3


def test_convs_per_block_stacks_convolutions_before_each_pool():
    net = CNN(input_shape=(1, 28, 28), num_classes=10, channels=[8, 16], convs_per_block=2)
    layers = [type(m).__name__ for m in net.features]
    assert layers.count("Conv2d") == 4 and layers.count("MaxPool2d") == 2
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_mirror_average_predicts_an_image_and_its_mirror_alike_but_trains_on_each():
    torch.manual_seed(0)
    averaged = CNN((3, 32, 32), 10, channels=[8, 16], dropout=0.0, mirror_average=True)
    plain = CNN((3, 32, 32), 10, channels=[8, 16], dropout=0.0)
    plain.load_state_dict(averaged.state_dict())
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(averaged(x), plain(x))  # training: the images as they come
    averaged.eval(), plain.eval()
    torch.testing.assert_close(averaged(x), averaged(x.flip(3)))
    torch.testing.assert_close(averaged(x), (plain(x) + plain(x.flip(3))) / 2)
