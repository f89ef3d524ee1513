"""The pictures a run draws (litforge/plots/figures.py) show all their text, whatever the class
count."""

import pytest
import torch

from litforge.plots import figures as plots

NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker"]


@pytest.mark.parametrize("classes", [2, 3, 8, 20])
def test_confusion_matrix_text_lies_within_the_picture(tmp_path, classes):
    names = (NAMES * 3)[:classes]
    matrix = torch.randint(0, 50, (classes, classes))
    path = tmp_path / "confusion_matrix.png"
    figure = plots.confusion_matrix(matrix, names, path)
    assert path.read_bytes().startswith(b"\x89PNG")
    renderer = figure.canvas.get_renderer()
    ax = figure.axes[0]
    texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels()]
    texts += ax.get_yticklabels()
    for text in texts:
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0, text.get_text()
        assert box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height, text.get_text()
    plots.close(figure)
