#!/usr/bin/env python3
"""Makes this folder's fixtures with PyTorch (Debian 12's python3-torch 1.13.1): a small MLP
(Linear 16 -> 64, a GELU, Linear 64 -> 16) exported at opset 17 in eval mode with each GELU
spelling passes/fuse_gelu.cpp recognises:

    mlp_erf.onnx       nn.GELU()                    Div, Erf, Add, Mul, Mul
    mlp_tanh.onnx      nn.GELU(approximate='tanh')  torch's tanh export
    mlp_gelu_new.onnx  HF GPT-2's gelu_new: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))

with x.npy (the fixed input, [4, 8, 16] float32) and y_<name>.npy (PyTorch's output on it).

    python3 tests/runtime/data/torch_gelu_mlp/make.py   (from the repository root)
"""
import math
import os

import numpy as np
import torch
from torch import nn

here = os.path.dirname(os.path.abspath(__file__))


class GeluNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def mlp(act):
    return nn.Sequential(nn.Linear(16, 64), act, nn.Linear(64, 16)).eval()


torch.manual_seed(0)
x = torch.randn(4, 8, 16) * 2
np.save(os.path.join(here, "x.npy"), x.numpy())
for name, act in [("erf", nn.GELU()), ("tanh", nn.GELU(approximate="tanh")),
                  ("gelu_new", GeluNew())]:
    model = mlp(act)
    torch.onnx.export(model, x, os.path.join(here, f"mlp_{name}.onnx"), opset_version=17,
                      input_names=["x"], output_names=["y"])
    with torch.no_grad():
        np.save(os.path.join(here, f"y_{name}.npy"), model(x).numpy())
