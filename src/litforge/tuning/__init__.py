"""`tune=lr` and `tune=batch_size`: Lightning's learning-rate and batch-size finders."""

from litforge.tuning.finders import FindBatchSize, FindLearningRate

__all__ = ["FindBatchSize", "FindLearningRate"]
