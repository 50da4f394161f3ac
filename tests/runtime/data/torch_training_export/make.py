#!/usr/bin/env python3
"""Makes this folder's fixture with PyTorch (Debian 12's python3-torch 1.13.1): a small MLP with
BatchNorm1d and Dropout, trained a few steps (so its weights and running statistics are not their
initial values), exported as a user exports a model to train it:
torch.onnx.export(..., training=TrainingMode.TRAINING, opset 17). Also writes x.npy (a batch of
8) and eval_y.npy: PyTorch's eval() output for x, the reference an inference plan must match.

    python3 tests/runtime/data/torch_training_export/make.py   (from the repository root)
"""
import os

import numpy as np
import torch
from torch import nn

here = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5),
                      nn.Linear(32, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model.train()
for _ in range(5):
    loss = model(torch.randn(32, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()

x = torch.randn(8, 16)
model.train()
torch.onnx.export(model, x, os.path.join(here, "mlp_bn_dropout_training.onnx"), opset_version=17,
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                  input_names=["x"], output_names=["y"],
                  dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
# The export traced a training-mode forward, which updated the running statistics it then
# wrote: eval() after it reads the same statistics as the file.
model.eval()
with torch.no_grad():
    eval_y = model(x)
np.save(os.path.join(here, "x.npy"), x.numpy())
np.save(os.path.join(here, "eval_y.npy"), eval_y.numpy())
print("eval_y[0]:", eval_y[0].tolist())
