"""Local training and evaluation."""

from .local import TrainConfig, bce, predict, train_epochs
from .metrics import binary_metrics

__all__ = ["TrainConfig", "bce", "binary_metrics", "predict", "train_epochs"]
