#!/usr/bin/env python3
"""Makes this folder's fixture with PyTorch (Debian 12's python3-torch 1.13.1) for gradient
clipping (stagec --clip-grad-norm): a small MLP whose middle Linear is applied twice (one tied
weight, which a pipeline split between its two uses holds on both stages), exported to ONNX
(opset 17), one batch (x.npy, y.npy: 8 rows), and reference.json: per max_norm C, PyTorch's MSE
losses over 3 SGD steps (lr 0.1) with torch.nn.utils.clip_grad_norm_(model.parameters(), C)
before each step, the norm it returned (before clipping) and the clipped gradients' norm. The
first C is under every step's norm (clipping binds), the second above it (it does not).

    python3 tests/runtime/data/torch_clip_mlp/make.py   (from the repository root)
"""
import copy
import json
import os

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
IN, HIDDEN, OUT, BATCH, STEPS, LR = 8, 16, 4, 8, 3, 0.1


class TiedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.mid = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.mid(h))
        h = torch.relu(self.mid(h))  # the same weight again
        return self.out(h)


torch.manual_seed(0)
model = TiedMLP()
x = torch.randn(BATCH, IN)
y = 3 * torch.randn(BATCH, OUT)  # far from the start's outputs: a large gradient
torch.onnx.export(model, x, os.path.join(here, "tied_mlp.onnx"), opset_version=17,
                  input_names=["x"], output_names=["out"],
                  dynamic_axes={"x": {0: "batch"}, "out": {0: "batch"}})
np.save(os.path.join(here, "x.npy"), x.numpy())
np.save(os.path.join(here, "y.npy"), y.numpy())


def train(max_norm):
    m = copy.deepcopy(model)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    losses, norms, clipped = [], [], []
    for _ in range(STEPS):
        loss = F.mse_loss(m(x), y)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        after = torch.norm(torch.stack([p.grad.detach().norm(2) for p in m.parameters()]), 2)
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        clipped.append(after.item())
    return {"max_norm": max_norm, "losses": losses, "norms": norms, "clipped_norms": clipped}


runs = [train(0.5), train(1000.0)]
assert all(n > 0.5 for n in runs[0]["norms"]), runs[0]["norms"]
with open(os.path.join(here, "reference.json"), "w") as f:
    json.dump({"sgd_lr": LR, "steps": STEPS, "runs": runs}, f, indent=1)
print(json.dumps(runs, indent=1))
