#!/usr/bin/env python3
"""Makes this folder's fixture with PyTorch (Debian 12's python3-torch 1.13.1): a 4-layer causal
nn.TransformerEncoder language model with Dropout 0.1, exported as a user exports a model to
train it (training=TrainingMode.TRAINING, no constant folding, opset 17). Its Dropouts keep a
bool mask per microbatch for the backward (about a quarter of the float activations' bytes),
which the plan's memory prediction must count: the test holds the measured peak under it.

    python3 tests/runtime/data/torch_encoder_dropout/make.py   (from the repository root)
"""
import os

import torch
from torch import nn

here = os.path.dirname(os.path.abspath(__file__))
VOCAB, WIDTH, HEADS, LAYERS, T = 64, 32, 2, 4, 32


class EncoderLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", torch.triu(torch.full((T, T), float("-inf")), 1))

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids), mask=self.mask))


torch.manual_seed(0)
model = EncoderLM().train()
ids = torch.randint(0, VOCAB, (8, T))
torch.onnx.export(model, ids, os.path.join(here, "encoder_lm_dropout.onnx"), opset_version=17,
                  input_names=["ids"], output_names=["logits"],
                  dynamic_axes={"ids": {0: "batch"}, "logits": {0: "batch"}},
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
