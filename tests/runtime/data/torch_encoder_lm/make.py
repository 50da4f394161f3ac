#!/usr/bin/env python3
"""Makes this folder's fixture with PyTorch (Debian 12's python3-torch 1.13.1): a 2-layer causal
nn.TransformerEncoder language model with its mask registered as a buffer, exported the default
way (eval mode, constant folding), which merges equal initializers: the deep-copied layers start
identical, so layer 1's weights become Identity nodes of layer 0's, and the -inf mask buffer is
an initializer read by an Add that feeds the Softmax. Also writes ids.npy and labels.npy (one
batch of 8 sequences of 8 tokens) and losses.json: PyTorch's cross-entropy losses over 3 SGD
steps (lr 0.1) on that batch, the losses a training plan of the export must give.

    python3 tests/runtime/data/torch_encoder_lm/make.py   (from the repository root)
"""
import json
import os

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
VOCAB, WIDTH, HEADS, LAYERS, T, BATCH = 50, 32, 2, 2, 8, 8


class EncoderLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", torch.triu(torch.full((T, T), float("-inf")), 1))

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids), mask=self.mask))


torch.manual_seed(0)
model = EncoderLM().eval()
ids = torch.randint(0, VOCAB, (BATCH, T))
labels = torch.randint(0, VOCAB, (BATCH, T))
torch.onnx.export(model, ids, os.path.join(here, "encoder_lm.onnx"), opset_version=17,
                  input_names=["ids"], output_names=["logits"],
                  dynamic_axes={"ids": {0: "batch"}, "logits": {0: "batch"}})
np.save(os.path.join(here, "ids.npy"), ids.numpy())
np.save(os.path.join(here, "labels.npy"), labels.numpy())

opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for _ in range(3):
    loss = F.cross_entropy(model(ids).reshape(-1, VOCAB), labels.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
with open(os.path.join(here, "losses.json"), "w") as f:
    json.dump({"sgd_lr": 0.1, "losses": losses,
               "parameters": sum(p.numel() for p in model.parameters())}, f)
print(losses)
