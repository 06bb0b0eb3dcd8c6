"""Training: the DeepLearningTask chain, data, checkpoints, callbacks."""
from blueprint.task._callbacks import EarlyStopping, ModelCheckpoint, StopTraining
from blueprint.task._checkpoint import CheckpointIntegrityError, load_checkpoint, save_checkpoint
from blueprint.task._fit_loop import DivergedError
from blueprint.task._position import ResumeError, interrupt_path
from blueprint.task._task import ConfigError, DeepLearningTask, EpochRecord, classification_metrics

__all__ = ["CheckpointIntegrityError", "ConfigError", "DeepLearningTask", "DivergedError", "EarlyStopping", "EpochRecord",
           "ModelCheckpoint", "ResumeError", "StopTraining", "classification_metrics", "interrupt_path", "load_checkpoint",
           "save_checkpoint"]
