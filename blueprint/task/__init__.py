"""Training: the DeepLearningTask chain, data, checkpoints, callbacks."""
from blueprint.task._callbacks import EarlyStopping, ModelCheckpoint, StopTraining
from blueprint.task._position import ResumeError
from blueprint.task._task import ConfigError, DeepLearningTask, EpochRecord, classification_metrics

__all__ = ["ConfigError", "DeepLearningTask", "EarlyStopping", "EpochRecord", "ModelCheckpoint", "ResumeError",
           "StopTraining", "classification_metrics"]
