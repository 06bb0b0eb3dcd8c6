"""Training: the DeepLearningTask chain, data, checkpoints."""
from blueprint.task._position import ResumeError
from blueprint.task._task import ConfigError, DeepLearningTask, EpochRecord, classification_metrics

__all__ = ["ConfigError", "DeepLearningTask", "EpochRecord", "ResumeError", "classification_metrics"]
