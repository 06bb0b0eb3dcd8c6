"""Datasets and the deterministic DataLoader used by DeepLearningTask.

>>> from blueprint.task.data import DataLoader, Augment, digits
>>> train, val = digits()
>>> loader = DataLoader(train, batch_size=64, mean=train.channel_stats()[0], std=train.channel_stats()[1],
...                     augment=Augment(crop_padding=1))
>>> x, y = next(loader.epoch(0))
>>> x.shape, x.dtype, y.dtype
((64, 8, 8, 1), dtype('float32'), dtype('int64'))
"""
from blueprint.task.data._dataset import ArrayDataset, validation_split
from blueprint.task.data._image_folder import image_folder
from blueprint.task.data._loader import Augment, DataLoader
from blueprint.task.data._sources import cifar10, digits, synthetic

__all__ = ["ArrayDataset", "Augment", "DataLoader", "cifar10", "digits", "image_folder", "synthetic",
           "validation_split"]
