"""Run the Triton kernels through Triton's CPU interpreter when there is no GPU.

This must happen before anything imports `kernels.verify_attention` (Triton picks interpreted or compiled at
decoration time). On a CUDA machine the same tests run compiled, on the GPU.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
