"""Pictures of a run: `plots/curves.png` (loss and accuracy per epoch) after training and
`plots/confusion_matrix.png` after testing, written by the `ClassificationPlots` callback
(`callbacks.plots`) and sent to TensorBoard when it logs."""

from litforge.plots.callback import ClassificationPlots

__all__ = ["ClassificationPlots"]
