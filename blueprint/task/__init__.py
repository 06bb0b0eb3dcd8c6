"""Training: the DeepLearningTask chain, data, checkpoints."""
from blueprint.task._task import ConfigError, DeepLearningTask, EpochRecord, classification_metrics

__all__ = ["ConfigError", "DeepLearningTask", "EpochRecord", "classification_metrics"]
