"""Every CPU kernel of docs/kernel-contract.md under its contract name.

Kernels write into the arrays they are given (C-contiguous fp32 views, NHWC) and
allocate nothing large; ``planner.reference`` is their spec.
"""
from cpu_ref._activation import ACTIVATION_KERNELS, activation_backward, activation_forward
from cpu_ref._channel_mul import channel_mul_backward, channel_mul_forward
from cpu_ref._conv import conv2d_backward, conv2d_forward, epilogue_supported, forward_workspace_used
from cpu_ref._epilogue import Epilogue, eval_scale_shift
from cpu_ref._drop_path import drop_path_backward, drop_path_forward
from cpu_ref._linear import linear_backward, linear_forward
from cpu_ref._loss import softmax_cross_entropy
from cpu_ref._misc import (accumulate_into, add_forward, channel_pad_backward, channel_pad_forward, dropout_backward,
                           dropout_forward)
from cpu_ref._norm import batchnorm_backward, batchnorm_forward_eval, batchnorm_forward_train, local_channel_sums
from cpu_ref._optim import adam_step, sgd_step
from cpu_ref._prelu import prelu_backward, prelu_forward
from cpu_ref._pool import (avgpool_backward, avgpool_forward, gap_backward, gap_forward, maxpool_backward,
                           maxpool_forward)

__all__ = [
    "ACTIVATION_KERNELS",
    "conv2d_forward", "conv2d_backward", "Epilogue", "epilogue_supported", "eval_scale_shift",
    "forward_workspace_used",
    "batchnorm_forward_train", "batchnorm_forward_eval", "batchnorm_backward", "local_channel_sums",
    "activation_forward", "activation_backward",
    "maxpool_forward", "maxpool_backward", "avgpool_forward", "avgpool_backward", "gap_forward", "gap_backward",
    "linear_forward", "linear_backward",
    "add_forward", "accumulate_into", "dropout_forward", "dropout_backward",
    "channel_pad_forward", "channel_pad_backward",
    "channel_mul_forward", "channel_mul_backward", "drop_path_forward", "drop_path_backward",
    "prelu_forward", "prelu_backward",
    "softmax_cross_entropy",
    "sgd_step", "adam_step",
]
