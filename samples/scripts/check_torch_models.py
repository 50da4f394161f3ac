#!/usr/bin/python3
"""Checks the model families PyTorch exports against stagecraft, by hand (not a test).

For each model: export it from PyTorch 1.13 at opset 17 (random weights, batch as a symbolic
dim), plan it with stagec on 2 and 4 devices, run it with stagerun and compare the outputs with
PyTorch's; export it again for training (TrainingMode.TRAINING, so BatchNormalization keeps
its batch statistics), train 3 SGD steps on 2 and 4 devices and compare the losses with
PyTorch's own 3 SGD steps on the same weights and data, with the same microbatches (PyTorch
accumulates loss / M over the M microbatches, as the pipeline does); for models with
BatchNorm, again from an eval-mode export (running statistics; torch.onnx folds each BatchNorm
into its Conv, so the script folds them in PyTorch too, with torch.fx). Each loss run is also
compared with PyTorch in float64, the noise floor: "fp32" marks runs where PyTorch's own
float32 run is over the tolerance from float64 and stagecraft within the spread of float32
itself there: 3x PyTorch's distance, or the farthest of PyTorch's float32 runs from weights
moved by one ulp (ULP_RUNS runs, each weight times 1 +- 2^-23, a rounding's worth), when that
is farther.
Prints one row per model (docs/models.md).

Needs Debian's python3-torch and python3-torchvision (the tests do not):
    /usr/bin/python3 samples/scripts/check_torch_models.py [--build build] [--work DIR]
        [--only NAME,...] [--family F] [--no-train] [--no-fp64] [--list]

Choices that keep the comparison exact:
- Dropout and stochastic depth are set to p = 0: stagecraft's training-mode masks are seeded
  its own way, not PyTorch's, so losses with dropout agree only in distribution.
- BatchNorm running statistics and affine parameters are randomised (fresh ones make an
  eval-mode BatchNorm the identity, which would test nothing), and parameters PyTorch
  initialises to zero (ViT's head) get N(0, 0.02) so the output has a scale to compare with.
- Inference: the batch (4) is cut into as many microbatches as devices; training: 2
  microbatches of 2 on both 2 and 4 devices.
Plans are costed by the roofline of --device-spec cpu (no profiling: correctness only).
"""
import argparse
import math
import warnings
import copy
import json
import os
import subprocess
import sys
import time
from collections import OrderedDict

import numpy as np
import torch
import torchvision
from torch import nn
from torchvision import models as tvm

BATCH = 4
TRAIN_MICROBATCHES = 2
STEPS = 3
LR = float(os.environ.get("CHECK_LR", "0.01"))
OUT_TOL = 1e-4
LOSS_TOL = 1e-4
# torch.onnx.export's opset (CHECK_OPSET): 17, the newest torch 1.13 writes; its default is 14,
# and older exports are 11 to 13 (other forms: Squeeze's axes as an attribute, Split's sizes).
OPSET = int(os.environ.get("CHECK_OPSET", "17"))
# 18 to 22: torch 1.13 writes 17 at most, so the export is at 17 and then rewritten into the
# form newer exporters write (upgrade_opset): what stagec reads as opset 17 again.
# The training plans' schedule (CHECK_SCHEDULE: a stagec --schedule name; interleaved plans 2
# chunks a device); unset: stagec's default.
SCHEDULE = os.environ.get("CHECK_SCHEDULE", "")
ULP_RUNS = 12


# ----------------------------------------------------------------------------------------------
# Models


class FirstOutput(nn.Module):
    """torchvision's segmentation models return {'out': ...}; this returns the tensor."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


class FeatureList(nn.Module):
    """A backbone returning an OrderedDict of feature maps, as a tuple."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return tuple(self.m(x).values())


class FeatureLoss(nn.Module):
    """Training a multi-output backbone: the model's own scalar loss, the sum over its outputs
    of the mean squared error against one target per output (stagec's --loss takes one output)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, *targets):
        feats = self.m(x)
        return sum(((f - t) ** 2).mean() for f, t in zip(feats, targets))  # no aten::mse_loss export


class ConvVae(nn.Module):
    """PyTorch's examples/vae, convolutional: an encoder to mu and logvar, z = mu + eps * std
    with eps = torch.randn_like(std) (RandomNormalLike), a transposed-conv decoder; returns the
    reconstruction, mu and logvar. `noise` scales eps: prepare() sets it to 0 as it does
    Dropout's p (stagecraft's draws are not PyTorch's), the node staying in the export."""

    def __init__(self, latent=8):
        super().__init__()
        self.noise = 1.0
        self.enc = nn.Sequential(nn.Conv2d(1, 8, 4, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 4, 2, 1),
                                 nn.ReLU(), nn.Flatten())
        self.mu, self.logvar = nn.Linear(16 * 7 * 7, latent), nn.Linear(16 * 7 * 7, latent)
        self.up = nn.Linear(latent, 16 * 7 * 7)
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(),
                                 nn.ConvTranspose2d(8, 1, 4, 2, 1), nn.Sigmoid())

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        std = torch.exp(0.5 * logvar)
        z = mu + torch.randn_like(std) * self.noise * std
        return self.dec(self.up(z).view(-1, 16, 7, 7)), mu, logvar


class RoutedTokens(nn.Module):
    """Scatter and one-hot as token models write them: a top-1 router whose gate keeps only the
    chosen expert's score (zeros_like(...).scatter(-1, top, scores.gather(-1, top)):
    ScatterElements), per-row expert loads by scatter_add (reduction add), the tokens one-hot
    (F.one_hot: OneHot) into a bag-of-words feature; a linear head per token."""

    def __init__(self, vocab=50, d=32, experts=4):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.Linear(d, d * experts)
        self.bow = nn.Linear(vocab, d)
        self.head = nn.Linear(d + experts, vocab)
        self.d, self.e = d, experts

    def forward(self, ids):
        x = self.emb(ids)
        scores = self.router(x).softmax(-1)
        top = scores.argmax(-1, keepdim=True)
        gate = torch.zeros_like(scores).scatter(-1, top, scores.gather(-1, top))
        out = self.experts(x).view(*x.shape[:2], self.e, self.d)
        x = x + (out * gate.unsqueeze(-1)).sum(-2)
        load = torch.zeros(ids.shape[0], self.e, dtype=scores.dtype).scatter_add(
            1, top.squeeze(-1), scores.max(-1).values)
        bow = nn.functional.one_hot(ids, self.vocab).to(x.dtype).mean(1)
        x = x + self.bow(bow).unsqueeze(1)
        return self.head(torch.cat([x, load.unsqueeze(1).expand(-1, x.shape[1], -1)], -1))


class IndexingOps(nn.Module):
    """Indexing and clean-up ops as written by hand: torch.nan_to_num of a log that goes NaN
    (IsNaN, IsInf, Where), index_select and x[:, idx] (Gather), roll, flip,
    repeat_interleave (a Split of a constant folded at import), masked_fill."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3 * 8 * 8, 20)
        self.fc2 = nn.Linear(4 + 4 + 20 + 20 + 10 + 20, 10)
        self.register_buffer("idx", torch.tensor([0, 5, 7, 19]))

    def forward(self, x):
        h = self.fc1(x.flatten(1))
        h = torch.nan_to_num(torch.log(h), nan=0.0) + torch.isnan(h).float()
        parts = [h.index_select(1, self.idx), h[:, self.idx], torch.roll(h, 2, 1),
                 torch.flip(h, [1]), torch.repeat_interleave(h[:, :5], 2, dim=1),
                 h.masked_fill(h < 0, 0.5)]
        return self.fc2(torch.cat(parts, 1))


class Bicubic(nn.Module):
    """Bicubic resampling as super-resolution and position-embedding code writes it:
    F.interpolate(mode='bicubic') up by 2 (align_corners False) and to a size (align_corners
    True) between convolutions (Resize mode cubic, coefficient -0.75)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        self.head = nn.Linear(4 * 20 * 20, 10)

    def forward(self, x):
        h = nn.functional.interpolate(torch.relu(self.c1(x)), scale_factor=2, mode="bicubic",
                                      align_corners=False)
        h = nn.functional.interpolate(torch.relu(self.c2(h)), size=(20, 20), mode="bicubic",
                                      align_corners=True)
        return self.head(h.flatten(1))


class AllActivations(nn.Module):
    """Every activation module of torch.nn that exports (nn.Threshold with a nonzero threshold
    does not; nn.RReLU draws random slopes in training, as Dropout its masks), each on its own
    copy of a Linear's output, then a Linear head: Celu, Elu, Selu,
    PRelu, the hard and soft shrinks, LogSigmoid, Mish, GLU, Softmin, Softmax2d and the rest."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 8)
        self.acts = nn.ModuleList([
            nn.ELU(), nn.Hardshrink(), nn.Hardsigmoid(), nn.Hardtanh(), nn.Hardswish(),
            nn.LeakyReLU(), nn.LogSigmoid(), nn.PReLU(), nn.ReLU(), nn.ReLU6(),
            nn.SELU(), nn.CELU(0.7), nn.GELU(), nn.Sigmoid(), nn.SiLU(), nn.Mish(), nn.Softplus(),
            nn.Softshrink(), nn.Softsign(), nn.Tanh(), nn.Tanhshrink(), nn.GLU(), nn.Softmin(1),
            nn.Softmax2d(), nn.LogSoftmax(1)])
        self.head = nn.Linear(8 * 24 + 4, 10)

    def forward(self, x):
        h = self.fc(x.flatten(1))
        outs = [a(h.view(-1, 8, 1, 1)).flatten(1) if isinstance(a, nn.Softmax2d) else a(h)
                for a in self.acts]
        return self.head(torch.cat(outs, 1))


class HfBert(nn.Module):
    """A classifier as Hugging Face's BERT is called: input_ids, attention_mask (1 keeps a
    token) and token_type_ids as three graph inputs; word, position and segment embeddings,
    LayerNorm, nn.TransformerEncoder with the padding mask from attention_mask, the first
    token's state through a tanh pooler to the logits."""

    def __init__(self, vocab=500, d=64, ctx=16, classes=10):
        super().__init__()
        self.words, self.segments = nn.Embedding(vocab, d), nn.Embedding(2, d)
        self.positions = nn.Embedding(ctx, d)
        self.norm = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.pool, self.head = nn.Linear(d, d), nn.Linear(d, classes)

    def forward(self, input_ids, attention_mask, token_type_ids):
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.words(input_ids) + self.positions(pos) + self.segments(token_type_ids)
        h = self.enc(self.norm(h), src_key_padding_mask=attention_mask == 0)
        return self.head(torch.tanh(self.pool(h[:, 0])))


class NllLoss(nn.Module):
    """Training a classifier whose forward returns probabilities (a Keras-style port): the
    model's own loss, F.nll_loss over their clamped logarithm with class weights (a buffer) and
    the default ignore_index -100 (label -100 marks a sample out of the loss). On log_softmax's
    output instead, the exporter merges the two into SoftmaxCrossEntropyLoss; here it writes
    NegativeLogLikelihoodLoss."""

    def __init__(self, m, classes=10):
        super().__init__()
        self.m = m
        self.register_buffer("class_weight", torch.linspace(0.5, 1.5, classes))

    def forward(self, x, labels):
        log_probs = torch.log(self.m(x).clamp_min(1e-7))
        return nn.functional.nll_loss(log_probs, labels, weight=self.class_weight)


class MnistNet(nn.Module):
    """PyTorch's examples/mnist network (two convs, max-pool, dropout, two linears), ending in
    softmax probabilities rather than log_softmax (trained with NllLoss)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(16 * 12 * 12, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = nn.functional.relu(self.conv1(x))
        x = nn.functional.max_pool2d(nn.functional.relu(self.conv2(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        x = self.fc2(nn.functional.relu(self.fc1(x)))
        return nn.functional.softmax(x, dim=1)


class UNet(nn.Module):
    """A small U-Net: two down levels (Conv-BN-ReLU x2, MaxPool), a bottleneck, two up levels
    (ConvTranspose 2x2 stride 2, concat with the skip, Conv-BN-ReLU x2), a 1x1 head. `norm`
    makes the normalisation layer of a width (BatchNorm2d; GroupNorm as diffusion U-Nets use)."""

    def __init__(self, cin=3, classes=4, w=8, norm=nn.BatchNorm2d):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), norm(o),
                                 nn.ReLU(inplace=True), nn.Conv2d(o, o, 3, padding=1, bias=False),
                                 norm(o), nn.ReLU(inplace=True))

        self.d1, self.d2, self.mid = block(cin, w), block(w, 2 * w), block(2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.u2 = block(4 * w, 2 * w)
        self.up1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.u1 = block(2 * w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(nn.functional.max_pool2d(a, 2))
        c = self.mid(nn.functional.max_pool2d(b, 2))
        b = self.u2(torch.cat([self.up2(c), b], 1))
        a = self.u1(torch.cat([self.up1(b), a], 1))
        return self.head(a)


class UNetBilinear(UNet):
    """The same U-Net upsampling by bilinear interpolation (Resize) instead of ConvTranspose."""

    def __init__(self, cin=3, classes=4, w=8):
        super().__init__(cin, classes, w)
        self.up2 = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                 nn.Conv2d(4 * w, 2 * w, 1))
        self.up1 = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                 nn.Conv2d(2 * w, w, 1))


class WordLM(nn.Module):
    """A word-level language model: embedding, a 2-layer LSTM or GRU, a linear decoder."""

    def __init__(self, cell, vocab=500, emb=64, hidden=64, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = getattr(nn, cell)(emb, hidden, layers, batch_first=True)
        self.dec = nn.Linear(hidden, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return self.dec(h)


class RMSNorm(nn.Module):
    """Llama's normalisation as its code writes it: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    """A Llama-style block: RMSNorm, attention with rotary embeddings (cos and sin kept as
    buffers, rotate_half by slices and a Concat) and a bool causal mask buffer through
    masked_fill, then RMSNorm and a SwiGLU MLP; no biases."""

    def __init__(self, d, heads, ctx, hidden):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(ctx).float(), inv)
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)))

    @staticmethod
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def attention(self, x, rope=None):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, self.hd).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        cos, sin = rope if rope is not None else (self.cos[:t], self.sin[:t])
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        att = (q @ k.transpose(-2, -1)) / (self.hd ** 0.5)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x, rope=None):
        x = x + self.attention(self.n1(x), rope)
        h = self.n2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class LlamaLM(nn.Module):
    """A Llama-style decoder: token embedding, LlamaBlocks, RMSNorm, an LM head."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2, ctx=32, hidden=172):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, ctx, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class LlamaPositionsLM(LlamaLM):
    """LlamaLM with its rotary embeddings computed in forward, as Hugging Face's current Llama
    does: position ids from the padding (a running count of the tokens that are not id 0), their
    angles against the inverse frequencies, then cos and sin of [B, T, head dim] per call, so
    the export holds Sin and Cos of values that depend on the input."""

    def __init__(self, **kw):
        super().__init__(**kw)
        hd = self.blocks[0].hd
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd)))

    def forward(self, ids):
        positions = ((ids != 0).long().cumsum(-1) - 1).clamp(min=0)
        freqs = positions.unsqueeze(-1).float() * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        rope = (emb.cos().unsqueeze(1), emb.sin().unsqueeze(1))
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.norm(x))


class BertLike(nn.Module):
    """A BERT-style classifier: token and learned position embeddings, nn.TransformerEncoder
    (batch_first, GELU), the padding mask computed from the tokens (id 0 is padding) as
    key_padding_mask, a linear head on the first token. norm_first: pre-LayerNorm layers."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2, ctx=16, classes=10, norm_first=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, ctx, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        h = self.encoder(self.emb(ids) + self.pos[:, :ids.shape[1]], src_key_padding_mask=ids == 0)
        return self.head(h[:, 0])


class Gpt2Block(nn.Module):
    """A GPT-2 block as Hugging Face's GPT2Attention computes it: a bool causal buffer applied
    with torch.where and finfo.min, then the extended attention mask added, Softmax, c_proj;
    GELU (tanh form) MLP."""

    def __init__(self, d, heads, ctx):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)))

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, self.hd).transpose(1, 2)
                   for z in self.c_attn(self.ln_1(x)).split(d, dim=2))
        w = q @ k.transpose(-1, -2) / (self.hd ** 0.5)
        w = torch.where(self.bias[:t, :t], w, torch.tensor(torch.finfo(w.dtype).min))
        w = (w + mask).softmax(-1)
        x = x + self.c_proj((w @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt2Padded(nn.Module):
    """A GPT-2-style LM given padded batches, as Hugging Face's GPT2Model builds the mask: the
    attention mask (1 for a token, 0 for padding: here the tokens that are 0) extended to
    [B, 1, 1, T] as (1 - mask) * finfo.min and added to every layer's scores after its causal
    mask. The batches are left-padded (generation's padding side), so the first queries of a
    padded row attend to padding alone."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2, ctx=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Gpt2Block(d, heads, ctx) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        ids = ids.flip(1)  # the padding to the left
        keep = (ids != 0).to(torch.float32)[:, None, None, :]
        mask = (1.0 - keep) * torch.finfo(torch.float32).min
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.h:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def t5_bucket(rel, num_buckets=32, max_distance=128):
    """T5's bidirectional relative position bucket, as transformers' T5Attention computes it."""
    num_buckets //= 2
    ret = (rel > 0).long() * num_buckets
    n = rel.abs()
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return ret + torch.where(n < max_exact, n, large)


class T5Encoder(nn.Module):
    """A T5-style encoder: RMS LayerNorm without a mean (T5LayerNorm), unscaled scores plus a
    learned relative position bias (an nn.Embedding over log buckets computed from positions,
    made once and added in every layer), no biases, ReLU feed-forward, a linear head on the
    mean of the tokens."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2, classes=10):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.rel = nn.Embedding(32, heads)
        self.norms = nn.ModuleList(RMSNorm(d) for _ in range(2 * layers + 1))
        self.qkvo = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(4 * layers))
        self.ff = nn.ModuleList(nn.Linear(*io, bias=False) for _ in range(layers)
                                for io in ((d, 2 * d), (2 * d, d)))
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        b, t = ids.shape
        pos = torch.arange(t)
        bias = self.rel(t5_bucket(pos[None, :] - pos[:, None])).permute(2, 0, 1)[None]
        x = self.emb(ids)
        for layer in range(len(self.ff) // 2):
            q, k, v, o = self.qkvo[4 * layer:4 * layer + 4]
            h = self.norms[2 * layer](x)
            q, k, v = (f(h).view(b, t, self.heads, self.hd).transpose(1, 2) for f in (q, k, v))
            w = (q @ k.transpose(-1, -2) + bias).softmax(-1)
            x = x + o((w @ v).transpose(1, 2).reshape(b, t, -1))
            h = self.norms[2 * layer + 1](x)
            x = x + self.ff[2 * layer + 1](torch.relu(self.ff[2 * layer](h)))
        return self.head(self.norms[-1](x).mean(1))


class AudioEncoder(nn.Module):
    """A wav2vec 2.0-style classifier: a Conv1d feature extractor on the raw signal (GroupNorm
    after the first conv, GELU), LayerNorm and a projection, one nn.TransformerEncoderLayer, a
    linear head on the mean over time."""

    def __init__(self, width=32, d=64, classes=10):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, width, 10, 5, bias=False), nn.GroupNorm(width, width),
                                  nn.GELU(), nn.Conv1d(width, width, 3, 2, bias=False), nn.GELU(),
                                  nn.Conv1d(width, width, 2, 2, bias=False), nn.GELU())
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, d)
        self.layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, activation="gelu",
                                                batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.proj(self.norm(self.conv(x).transpose(1, 2)))
        return self.head(self.layer(h).mean(1))


class Mixer(nn.Module):
    """MLP-Mixer: 8x8 patches by a strided Conv, then blocks of token mixing (LayerNorm, an MLP
    across the patches of each channel: transposes around nn.Linear) and channel mixing, GELU."""

    def __init__(self, hw=64, patch=8, d=64, layers=2, classes=10):
        super().__init__()
        n = (hw // patch) ** 2
        self.stem = nn.Conv2d(3, d, patch, patch)
        self.blocks = nn.ModuleList(nn.ModuleList([nn.LayerNorm(d), nn.Linear(n, 2 * n),
                                                   nn.Linear(2 * n, n), nn.LayerNorm(d),
                                                   nn.Linear(d, 2 * d), nn.Linear(2 * d, d)])
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for n1, t1, t2, n2, c1, c2 in self.blocks:
            x = x + t2(nn.functional.gelu(t1(n1(x).transpose(1, 2)))).transpose(1, 2)
            x = x + c2(nn.functional.gelu(c1(n2(x))))
        return self.head(self.norm(x).mean(1))


class SuperResolution(nn.Module):
    """ESPCN-style 2x super-resolution: convolutions, then PixelShuffle (DepthToSpace) to twice
    the size; one output map, trained by its squared error (a tuple, as the features kind)."""

    def __init__(self, width=16):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 5, padding=2), nn.Tanh(),
                                  nn.Conv2d(width, width, 3, padding=1), nn.Tanh(),
                                  nn.Conv2d(width, 3 * 4, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, x):
        return (self.body(x),)


class TiedLM(nn.Module):
    """A decoder LM whose output head shares the token embedding's weight (head.weight =
    emb.weight, as GPT-2 and most LMs tie them: one parameter, two uses), pre-norm
    TransformerEncoderLayers with a causal float mask, the embedding's padding_idx 0 (PyTorch
    never updates that row)."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2, ctx=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, ctx, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx))

    def forward(self, ids):
        t = ids.shape[1]
        h = self.blocks(self.emb(ids) + self.pos[:, :t], mask=self.mask[:t, :t])
        return self.head(self.norm(h))


class PlainNorms(nn.Module):
    """Normalisations without learned parameters, which the exporter gives constant scale and
    shift initializers PyTorch has no parameter for: InstanceNorm2d (affine=False, its default,
    as style-transfer and CycleGAN nets use it), GroupNorm(affine=False) and BatchNorm2d
    (affine=False). (torch 1.13 exports LayerNorm(elementwise_affine=False) at opset 17 with an
    empty scale input, which its own ONNX checker refuses.)"""

    def __init__(self, width=8, classes=10):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, width, 3, 2, 1), nn.Conv2d(width, width, 3, 2, 1)
        self.c3 = nn.Conv2d(width, width, 3, 2, 1)
        self.n1 = nn.InstanceNorm2d(width)
        self.n2 = nn.GroupNorm(2, width, affine=False)
        self.n3 = nn.BatchNorm2d(width, affine=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = torch.relu(self.n1(self.c1(x)))
        x = torch.relu(self.n2(self.c2(x)))
        x = torch.relu(self.n3(self.c3(x)))
        return self.head(x.mean((2, 3)))


class ClipText(nn.Module):
    """CLIP's text encoder: pre-norm TransformerEncoder with a causal float mask buffer, the
    features taken at each row's end-of-text token, the largest id (x[arange(B),
    ids.argmax(-1)]: ArgMax, then advanced indexing), projected."""

    def __init__(self, vocab=500, d=64, ctx=16, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(ctx, d) * 0.01)
        layer = nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.register_buffer("mask", torch.full((ctx, ctx), float("-inf")).triu(1))
        self.ln = nn.LayerNorm(d)
        self.proj = nn.Linear(d, classes, bias=False)

    def forward(self, ids):
        x = self.ln(self.enc(self.emb(ids) + self.pos, mask=self.mask))
        return self.proj(x[torch.arange(x.shape[0]), ids.argmax(dim=-1)])


class FunctionalOps(nn.Module):
    """The functional ops models reach for, in one small CNN: activations (hardswish, mish, elu,
    silu, prelu, softplus, hardsigmoid, relu6, leaky_relu, gelu), glu, reflect and replicate
    pads, grouped and dilated convs, ceil-mode and padded pools, nearest and bilinear resizes,
    pixel (un)shuffle, roll, F.normalize, cumsum, clamp, masked_fill, amax, std and var,
    log_softmax, torch.tril, topk, argmax and an einsum attention."""

    def __init__(self, width=8, classes=10):
        super().__init__()
        self.c1 = nn.Conv2d(3, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, width, 3, padding=1)
        self.prelu = nn.PReLU(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        F = nn.functional
        h = self.c1(x)
        h = (F.hardswish(h) + F.mish(h) + F.elu(h) + F.silu(h) + self.prelu(h) + F.softplus(h)
             + F.hardsigmoid(h) + F.relu6(h) + F.leaky_relu(h, 0.1) + F.gelu(h)) * 0.1
        h = F.glu(torch.cat([h, h * 0.5], 1), dim=1)
        h = (F.pad(h, (1, 1, 1, 1), mode="reflect")[:, :, 1:-1, 1:-1]
             + F.pad(h, (2, 0, 0, 2), mode="replicate")[:, :, 2:, :-2])
        h = F.conv2d(h, self.c2.weight[:, :4], groups=2, padding=1) + F.conv2d(
            h, self.c2.weight, padding=2, dilation=2)
        h = (F.interpolate(F.max_pool2d(h, 3, 2, ceil_mode=True), size=h.shape[2:])
             + F.interpolate(F.avg_pool2d(h, 3, 2, padding=1, count_include_pad=False),
                             size=h.shape[2:], mode="bilinear", align_corners=False))
        h = F.pixel_shuffle(F.pixel_unshuffle(h, 2), 2) + torch.roll(h, 1, dims=3)
        h = F.normalize(h, dim=1) * 3 + torch.cumsum(h, dim=3) * 0.1
        h = torch.clamp(h, -0.5, 0.7) + h.masked_fill(h < -1, 0.0)
        h = h - h.amax(dim=(2, 3), keepdim=True) + h.std(dim=1, keepdim=True) + h.var(dim=3,
                                                                                     keepdim=True)
        h = F.log_softmax(h, dim=1) + torch.tril(h)
        v, _ = torch.topk(h.flatten(2), 4, dim=2)
        h = h + v.mean(2, keepdim=True).unsqueeze(-1) + h.argmax(1, keepdim=True).float() * 0.01
        b, c, hh, ww = h.shape
        t = h.flatten(2)
        a = torch.einsum("bci,bcj->bij", t, t).softmax(-1)
        h = torch.einsum("bij,bcj->bci", a, t).reshape(b, c, hh, ww)
        return self.head(h.mean((2, 3)))


class DetrDecoder(nn.Module):
    """DETR's head: a strided-conv backbone's map as memory (learned positions added), learned
    object queries through nn.TransformerDecoder (self- and cross-attention, Tq != Tk), class
    logits and sigmoid boxes (two outputs, trained by their squared errors)."""

    def __init__(self, d=32, queries=6, classes=10):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, d, 4, 4), nn.ReLU(), nn.Conv2d(d, d, 2, 2))
        self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.1)
        self.query = nn.Parameter(torch.randn(queries, d) * 0.1)
        self.dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(
            d, 4, 2 * d, dropout=0.0, batch_first=True), 2)
        self.cls = nn.Linear(d, classes)
        self.box = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 4))

    def forward(self, x):
        m = self.backbone(x).flatten(2).transpose(1, 2) + self.pos
        h = self.dec(self.query.unsqueeze(0).expand(x.shape[0], -1, -1), m)
        return (self.cls(h), self.box(h).sigmoid())


class Seq2Seq(nn.Module):
    """nn.Transformer as its tutorial uses it: source and target embeddings, 2 encoder and 2
    decoder layers, the target's causal mask from generate_square_subsequent_mask (a float -inf
    mask kept as a buffer), cross-attention over the encoder's output, a linear decoder. The one
    input is both the source (reversed) and the target."""

    def __init__(self, vocab=500, d=64, heads=4, layers=2, ctx=16):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
        self.core = nn.Transformer(d, heads, layers, layers, 2 * d, dropout=0.1, batch_first=True)
        self.register_buffer("tgt_mask", nn.Transformer.generate_square_subsequent_mask(ctx))
        self.dec = nn.Linear(d, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.core(self.src_emb(ids.flip(1)), self.tgt_emb(ids), tgt_mask=self.tgt_mask[:t, :t])
        return self.dec(h)


def image(hw):
    return ("image", (3, hw, hw))


def tokens(vocab, seq, padded=False):
    return ("tokens", (seq,), vocab) + (("padded",) if padded else ())


def small_vit():
    return tvm.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4,
                                 hidden_dim=64, mlp_dim=128, num_classes=10)


def small_swin():
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2, 2, 2],
                           num_heads=[2, 2, 4, 4], window_size=[7, 7], num_classes=10)


def small_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    cfg = [CNBlockConfig(32, 64, 1), CNBlockConfig(64, 128, 1), CNBlockConfig(128, 256, 2),
           CNBlockConfig(256, None, 1)]
    return ConvNeXt(cfg, num_classes=10)


def small_densenet():
    return tvm.DenseNet(growth_rate=16, block_config=(2, 3, 4, 3), num_init_features=32,
                        num_classes=10)


def fpn_backbone(name, extra=None):
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    kw = {"extra_blocks": extra} if extra is not None else {}
    return FeatureList(resnet_fpn_backbone(backbone_name=name, weights=None, trainable_layers=5,
                                           **kw))


def retinanet_backbone():
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    body = tvm.resnet18(weights=None)
    return FeatureList(_resnet_fpn_extractor(body, 5, returned_layers=[2, 3, 4],
                                             extra_blocks=LastLevelP6P7(256, 256)))


def mobilenet_fpn_backbone():
    from torchvision.models.detection.backbone_utils import mobilenet_backbone
    return FeatureList(mobilenet_backbone(backbone_name="mobilenet_v3_large", weights=None,
                                          fpn=True, trainable_layers=6))


def ssdlite_backbone():
    m = tvm.detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                    num_classes=10)
    return FeatureList(m.backbone)


# name: (family, builder, input, kind, note). kind: classes (cross-entropy over axis 1),
# segment (cross-entropy over axis 1 of [N,C,H,W]), lm (cross-entropy over the last axis),
# dense (mse against a target), features (a tuple of maps: the model's own loss), nll (10
# probabilities: the model's own loss, NllLoss).
MODELS = OrderedDict([
    ("resnet18", ("classification", lambda: tvm.resnet18(num_classes=10), image(64), "classes", "")),
    ("resnet50", ("classification", lambda: tvm.resnet50(num_classes=10), image(64), "classes", "")),
    ("mobilenet_v2", ("classification", lambda: tvm.mobilenet_v2(width_mult=0.5, num_classes=10),
                      image(64), "classes", "width_mult 0.5")),
    ("mobilenet_v3_small", ("classification", lambda: tvm.mobilenet_v3_small(num_classes=10),
                            image(64), "classes", "")),
    ("mobilenet_v3_large", ("classification", lambda: tvm.mobilenet_v3_large(num_classes=10),
                            image(64), "classes", "")),
    ("efficientnet_b0", ("classification", lambda: tvm.efficientnet_b0(num_classes=10), image(64),
                         "classes", "")),
    ("densenet_small", ("classification", small_densenet, image(64), "classes",
                        "torchvision DenseNet, growth 16, blocks (2,3,4,3)")),
    ("densenet121", ("classification", lambda: tvm.densenet121(num_classes=10), image(64),
                     "classes", "")),
    ("shufflenet_v2_x0_5", ("classification", lambda: tvm.shufflenet_v2_x0_5(num_classes=10),
                            image(64), "classes", "")),
    ("squeezenet1_1", ("classification", lambda: tvm.squeezenet1_1(num_classes=10), image(64),
                       "classes", "")),
    ("googlenet", ("classification", lambda: tvm.googlenet(num_classes=10, aux_logits=False,
                                                           init_weights=True),
                   image(64), "classes", "aux_logits False")),
    ("inception_v3", ("classification", lambda: tvm.inception_v3(num_classes=10, aux_logits=False,
                                                                 init_weights=True),
                      image(96), "classes", "aux_logits False, 96x96")),
    ("vit_small", ("classification", small_vit, image(64), "classes",
                   "torchvision VisionTransformer: 64x64, patch 16, 2 layers, width 64")),
    ("swin_small", ("classification", small_swin, image(64), "classes",
                    "torchvision SwinTransformer: width 32, depths 2,2,2,2, window 7")),
    ("convnext_small", ("classification", small_convnext, image(64), "classes",
                        "torchvision ConvNeXt: widths 32..256, blocks 1,1,2,1")),
    ("regnet_x_400mf", ("classification", lambda: tvm.regnet_x_400mf(num_classes=10), image(64),
                        "classes", "")),
    ("regnet_y_400mf", ("classification", lambda: tvm.regnet_y_400mf(num_classes=10), image(64),
                        "classes", "")),
    ("fcn_resnet50", ("segmentation", lambda: FirstOutput(tvm.segmentation.fcn_resnet50(
        weights=None, weights_backbone=None, num_classes=4, aux_loss=False)), image(64), "segment",
        "4 classes")),
    ("deeplabv3_mobilenet_v3_large", ("segmentation", lambda: FirstOutput(
        tvm.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                      num_classes=4, aux_loss=False)),
        image(64), "segment", "4 classes")),
    ("lraspp_mobilenet_v3_large", ("segmentation", lambda: FirstOutput(
        tvm.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                   num_classes=4)),
        image(64), "segment", "4 classes")),
    ("fasterrcnn_resnet18_fpn_backbone", ("detection backbone", lambda: fpn_backbone("resnet18"),
                                          image(64), "features",
                                          "resnet_fpn_backbone('resnet18'): FPN, 5 maps")),
    ("retinanet_resnet18_fpn_backbone", ("detection backbone", retinanet_backbone, image(64),
                                         "features", "ResNet-18 + FPN with P6/P7, 5 maps")),
    ("fasterrcnn_mobilenet_v3_fpn_backbone", ("detection backbone", mobilenet_fpn_backbone,
                                              image(64), "features",
                                              "mobilenet_backbone(fpn=True): 3 maps")),
    ("ssdlite_backbone", ("detection backbone", ssdlite_backbone, image(64), "features",
                          "ssdlite320_mobilenet_v3_large's backbone: 6 maps")),
    ("unet", ("U-Net", lambda: UNet(), image(64), "segment", "width 8, ConvTranspose up")),
    ("unet_groupnorm", ("U-Net", lambda: UNet(norm=lambda c: nn.GroupNorm(4, c)), image(64),
                        "segment", "the first with GroupNorm (4 groups): torch exports it "
                        "through InstanceNormalization")),
    ("unet_bilinear", ("U-Net", lambda: UNetBilinear(), image(64), "segment",
                       "width 8, bilinear Resize up")),
    ("lstm_lm", ("recurrent LM", lambda: WordLM("LSTM"), tokens(500, 16), "lm",
                 "vocab 500, 2 layers of 64, 16 tokens")),
    ("gru_lm", ("recurrent LM", lambda: WordLM("GRU"), tokens(500, 16), "lm",
                "vocab 500, 2 layers of 64, 16 tokens")),
    ("llama_lm", ("decoder LM", lambda: LlamaLM(), tokens(500, 16), "lm",
                  "Llama-style: RMSNorm, rotary embeddings, masked_fill causal mask, SwiGLU; "
                  "vocab 500, 2 layers of 64, 4 heads, 16 tokens")),
    ("bert_encoder", ("encoder", lambda: BertLike(), tokens(500, 16, True), "classes",
                      "nn.TransformerEncoder, GELU, key_padding_mask from the tokens; vocab 500, "
                      "2 layers of 64, 4 heads, 16 tokens")),
    ("bert_encoder_prenorm", ("encoder", lambda: BertLike(norm_first=True), tokens(500, 16, True),
                              "classes", "the same with norm_first (pre-LayerNorm)")),
    ("gpt2_padded", ("decoder LM", lambda: Gpt2Padded(), tokens(500, 16, True), "lm",
                     "GPT-2 as Hugging Face writes its attention: causal torch.where with "
                     "finfo.min, then the extended attention mask of left-padded batches "
                     "added; vocab 500, 2 layers of 64, 4 heads, 16 tokens")),
    ("t5_encoder", ("encoder", lambda: T5Encoder(), tokens(500, 16), "classes",
                    "T5-style: RMS norm, unscaled scores plus a learned relative position bias "
                    "from log buckets; vocab 500, 2 layers of 64, 4 heads, 16 tokens")),
    ("audio_encoder", ("audio", lambda: AudioEncoder(), ("image", (1, 800)), "classes",
                       "wav2vec 2.0-style: Conv1d feature extractor with GroupNorm and GELU, "
                       "a TransformerEncoderLayer; 800 samples")),
    ("mlp_mixer", ("classification", lambda: Mixer(), image(64), "classes",
                   "MLP-Mixer: 8x8 patches, 2 blocks of width 64")),
    ("super_resolution", ("super-resolution", lambda: SuperResolution(), image(32), "features",
                          "ESPCN-style: 3 convs and PixelShuffle(2), 32x32 to 64x64")),
    ("tied_lm", ("decoder LM", lambda: TiedLM(), tokens(500, 16, True), "lm",
                 "output head tied to the token embedding, padding_idx 0, pre-norm "
                 "TransformerEncoder with a causal mask; vocab 500, 2 layers of 64, 16 tokens")),
    ("plain_norms", ("classification", lambda: PlainNorms(), image(32), "classes",
                     "InstanceNorm2d, GroupNorm and BatchNorm2d without affine parameters")),
    ("clip_text", ("encoder", lambda: ClipText(), tokens(500, 16), "classes",
                   "CLIP's text encoder: causal pre-norm layers, pooled at each row's argmax "
                   "token; vocab 500, 2 layers of 64, 16 tokens")),
    ("functional_ops", ("classification", lambda: FunctionalOps(), image(16), "classes",
                        "a CNN through 30-odd functional ops (activations, pads, pools, resizes, "
                        "pixel shuffle, normalize, cumsum, log_softmax, tril, topk, argmax, "
                        "einsum)")),
    ("detr_decoder", ("detection", lambda: DetrDecoder(), image(32), "features",
                      "DETR's head: object queries through nn.TransformerDecoder over a conv "
                      "map; class logits and boxes")),
    ("llama_positions", ("decoder LM", lambda: LlamaPositionsLM(), tokens(500, 16, padded=True),
                         "lm", "llama_lm with its rotary cos and sin computed in forward from "
                         "position ids counted past the padding (Sin, Cos, CumSum on the input)")),
    ("conv_vae", ("generative", lambda: ConvVae(), ("image", (1, 28, 28)), "features",
                  "PyTorch's VAE example, convolutional: torch.randn_like in the "
                  "reparameterisation (RandomNormalLike; its scale 0 here), outputs the "
                  "reconstruction, mu and logvar")),
    ("routed_tokens", ("decoder LM", lambda: RoutedTokens(), tokens(50, 12), "lm",
                       "a top-1 routed token model: the gate by scatter of the chosen score "
                       "(ScatterElements), expert loads by scatter_add, F.one_hot bag of words "
                       "(OneHot)")),
    ("indexing_ops", ("classification", lambda: IndexingOps(), image(8), "classes",
                      "nan_to_num of a log that goes NaN (IsNaN, IsInf), index_select, x[:, idx], "
                      "roll, flip, repeat_interleave, masked_fill")),
    ("bicubic", ("super-resolution", lambda: Bicubic(), image(8), "classes",
                 "F.interpolate(mode='bicubic') up by 2 and to a size with align_corners (Resize "
                 "mode cubic) between convolutions; 8x8 images")),
    ("all_activations", ("classification", lambda: AllActivations(), image(8), "classes",
                         "every exportable torch.nn activation module on a Linear's output "
                         "(Celu, the shrinks, LogSigmoid, Mish, GLU, Softmin, ...)")),
    ("hf_bert", ("encoder", lambda: HfBert(), ("tokens_mask", (16,), 500), "classes",
                 "BERT called as Hugging Face calls it: input_ids, attention_mask and "
                 "token_type_ids as three graph inputs; vocab 500, 2 layers of 64, 16 tokens")),
    ("mnist_nll", ("classification", lambda: MnistNet(), ("image", (1, 28, 28)), "nll",
                   "PyTorch's MNIST example ending in softmax probabilities, trained by its own "
                   "F.nll_loss of their log, with class weights and an ignored label (-100)")),
    ("transformer_seq2seq", ("encoder-decoder", lambda: Seq2Seq(), tokens(500, 16), "lm",
                             "nn.Transformer, 2+2 layers of 64, 4 heads, causal target mask "
                             "buffer, cross-attention; vocab 500, 16 tokens")),
])

# Full detection models: data-dependent shapes (NonZero, TopK), which a static plan refuses.
REFUSED = OrderedDict([
    ("fasterrcnn_mobilenet_v3_large_320_fpn", lambda: tvm.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=10)),
    ("ssdlite320_mobilenet_v3_large", lambda: tvm.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=10)),
])


# ----------------------------------------------------------------------------------------------
# Helpers


def prepare(model):
    """Dropout and stochastic depth off; BatchNorm statistics and zero parameters randomised."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if isinstance(m, ConvVae):
            m.noise = 0.0
        if isinstance(m, (nn.LSTM, nn.GRU, nn.MultiheadAttention)):
            m.dropout = 0.0  # a float, not a Dropout module
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                if m.running_mean is not None:
                    m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                if m.weight is not None:
                    m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def make_input(spec, batch, g):
    """The model's inputs: a tuple, and their names (INPUT_NAMES)."""
    if spec[0] == "image":
        return (torch.randn((batch,) + spec[1], generator=g),)
    padded = len(spec) > 3 and spec[3] == "padded"
    ids = torch.randint(1 if padded else 0, spec[2], (batch,) + spec[1], generator=g)
    if spec[0] == "tokens_mask":
        # Hugging Face's three inputs: ids, attention_mask (row i right-padded by 2i), and
        # token_type_ids (the second half of each row segment 1).
        mask = torch.ones_like(ids)
        types = torch.zeros_like(ids)
        types[:, ids.shape[1] // 2:] = 1
        for i in range(batch):
            mask[i, ids.shape[1] - 2 * i:] = 0
        return (ids, mask, types)
    if padded:  # row i ends in 3i padding tokens (id 0)
        for i in range(batch):
            ids[i, ids.shape[1] - 3 * i:] = 0
    return (ids,)


def input_names(spec):
    return ["input_ids", "attention_mask", "token_type_ids"] if spec[0] == "tokens_mask" else ["input"]


def run(cmd, log, timeout):
    t = time.time()
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout} s\n")
            return None, f"timed out after {timeout} s", time.time() - t
        f.write(p.stdout + p.stderr + f"(exit {p.returncode}, {time.time() - t:.1f} s)\n")
    if p.returncode != 0:
        lines = [l for l in p.stderr.splitlines() if l.strip()] or ["exit %d" % p.returncode]
        err = next((l for l in lines if "error" in l), lines[-1])
        return None, err, time.time() - t
    return p.stdout, None, time.time() - t


def export(model, args, path, names_in, names_out, training, fold=True):
    dyn = {n: {0: "batch"} for n in names_in + names_out if n != "loss"}
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    model.train(training)
    torch.onnx.export(model, args, path, opset_version=min(OPSET, 17), input_names=names_in,
                      output_names=names_out, dynamic_axes=dyn, training=mode,
                      do_constant_folding=fold)
    if OPSET > 17:
        upgrade_opset(path, OPSET)


def upgrade_opset(path, opset):
    """Rewrites the opset-17 model at `path` into opset `opset`'s form, as torch 2.x's exporters
    write it: every Reduce op but ReduceSum takes its axes as an int64 initializer input, Split
    with as many equal parts as outputs says num_outputs, ir_version 10."""
    import onnx
    from onnx import helper, numpy_helper
    m = onnx.load(path)
    for imp in m.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset
    m.ir_version = 10
    for k, n in enumerate(m.graph.node):
        if n.op_type.startswith("Reduce") and n.op_type != "ReduceSum":
            axes = [a for a in n.attribute if a.name == "axes"]
            if axes:
                name = f"{n.name or n.op_type}_axes_{k}"
                m.graph.initializer.append(
                    numpy_helper.from_array(np.array(list(axes[0].ints), dtype=np.int64), name))
                n.attribute.remove(axes[0])
                n.input.append(name)
        if n.op_type == "Split" and len(n.input) == 1:
            n.attribute.append(helper.make_attribute("num_outputs", len(n.output)))
    onnx.save(m, path)


def save(dirname, arrays):
    os.makedirs(dirname, exist_ok=True)
    for name, a in arrays.items():
        np.save(os.path.join(dirname, name + ".npy"), a)


# ----------------------------------------------------------------------------------------------
# One model


def check(name, opts):
    family, build, spec, kind, note = MODELS[name]
    work = os.path.join(opts.work, name)
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "log.txt")
    open(log, "w").close()
    stagec = os.path.join(opts.build, "tools", "stagec")
    stagerun = os.path.join(opts.build, "tools", "stagerun")
    row = {"family": family, "model": name, "note": note, "import": "-", "plan": "-",
           "run": "-", "out_err": None, "error": "", "seconds": 0.0}
    t0 = time.time()

    torch.manual_seed(0)
    model = prepare(build())
    g = torch.Generator().manual_seed(2)
    x = make_input(spec, BATCH, g)
    names = input_names(spec)

    # Inference: eval-mode export, outputs against PyTorch's on the whole batch.
    model.eval()
    with torch.no_grad():
        ref = model(*x)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    out_names = ["output"] if len(refs) == 1 else [f"output{i}" for i in range(len(refs))]
    onnx_path = os.path.join(work, name + ".onnx")
    export(model, x, onnx_path, names, out_names, training=False)
    save(os.path.join(work, "in"), {n: t.numpy() for n, t in zip(names, x)})

    out, err, _ = run([stagec, onnx_path, "--info", "--batch", str(BATCH)], log, opts.timeout)
    if err:
        row.update({"import": "FAIL", "error": err, "seconds": time.time() - t0})
        return row
    row["import"] = "ok"
    worst = 0.0
    for d in (2, 4):
        plan = os.path.join(work, f"plan_inf_{d}")
        _, err, _ = run([stagec, onnx_path, "-o", plan, "--devices", str(d), "--batch", str(BATCH),
                         "--microbatches", str(d), "--device-spec", "cpu"], log, opts.timeout)
        if err:
            row.update({"plan": f"FAIL@{d}", "error": err, "seconds": time.time() - t0})
            return row
        outdir = os.path.join(work, f"out_{d}")
        _, err, _ = run([stagerun, plan, "--steps", "1", "--inputs", os.path.join(work, "in"),
                         "--outputs", outdir, "-q"], log, opts.timeout)
        if err:
            row.update({"plan": "2,4" if d == 4 else "2", "run": f"FAIL@{d}", "error": err,
                        "seconds": time.time() - t0})
            return row
        for n, r in zip(out_names, refs):
            got = np.load(os.path.join(outdir, n + ".npy"))
            r = r.numpy()
            if got.shape != r.shape:
                row.update({"plan": "2,4", "run": f"shape@{d}",
                            "error": f"{n}: {got.shape} against PyTorch's {r.shape}",
                            "seconds": time.time() - t0})
                return row
            scale = float(np.abs(r).max()) or 1.0
            worst = max(worst, float(np.abs(got - r).max()) / scale)
    row.update({"plan": "2,4", "out_err": worst,
                "run": "ok" if worst <= OUT_TOL else "DIFF"})

    if opts.no_train:
        row["seconds"] = time.time() - t0
        return row

    # Training, 3 SGD steps on 2 microbatches of 2: a TrainingMode.TRAINING export (BatchNorm
    # on each microbatch's statistics) and, for models with BatchNorm, an eval-mode export
    # without constant folding (BatchNorm on its running statistics, as PyTorch's eval()).
    if spec[0] == "image":
        hw = spec[1][1:]
    if kind == "classes":
        labels = torch.randint(0, 10, (BATCH,), generator=g)
    elif kind == "nll":
        labels = torch.randint(0, 10, (BATCH,), generator=g)
        labels[1] = -100  # ignore_index: one sample of the first microbatch out of the loss
    elif kind == "segment":
        labels = torch.randint(0, 4, (BATCH,) + tuple(hw), generator=g)
    elif kind == "lm":
        labels = torch.randint(0, spec[2], (BATCH,) + spec[1], generator=g)
    elif kind == "features":
        labels = [torch.randn(r.shape, generator=g) for r in refs]
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    for mode in ("batch", "eval") if has_bn else ("batch",):
        res = train_check(name, mode, build, kind, x, labels, work, log, opts)
        key = "train" if mode == "batch" else "train_eval"
        row.update({key: res["status"], key + "_err": res["err"], key + "_err64": res["err64"],
                    key + "_floor": res["floor"], key + "_ulp": res.get("ulp_spread"),
                    key + "_weights": res.get("weights_checked")})
        if res["error"] and not row["error"]:
            row["error"] = res["error"]
    if not has_bn:
        row["train_eval"] = "no BN"
    row["seconds"] = time.time() - t0
    return row


def train_check(name, mode, build, kind, x, labels, work, log, opts):
    """Exports for training (mode batch: TrainingMode.TRAINING; eval: eval mode, BatchNorm on
    its running statistics), trains STEPS SGD steps on 2 and 4 devices, and compares the losses
    with PyTorch's in float32 (and float64: the noise floor)."""
    stagec = os.path.join(opts.build, "tools", "stagec")
    stagerun = os.path.join(opts.build, "tools", "stagerun")
    names = input_names(MODELS[name][2])
    res = {"status": "-", "err": None, "err64": None, "floor": None, "error": ""}

    def make():
        torch.manual_seed(0)
        m = prepare(build())
        if mode == "eval":
            # torch.onnx folds an eval-mode BatchNorm into the Conv before it whatever
            # do_constant_folding says, so SGD would train other parameters than PyTorch's:
            # fold them here (torch.fx), for the export and PyTorch's run alike.
            from torch.fx.experimental.optimization import fuse
            m = fuse(m.eval())
        return m

    try:
        model = make()
    except Exception as e:  # a model torch.fx cannot trace
        res.update({"status": "no fx trace"})
        return res
    train_model = own_loss(model, kind)
    train_path = os.path.join(work, f"{name}_train_{mode}.onnx")
    training = mode == "batch"
    if kind == "features":
        tnames = [f"target{i}" for i in range(len(labels))]
        export(train_model, (*x, *labels), train_path, names + tnames, ["loss"], training,
               fold=False)
        data = {n: t.numpy() for n, t in zip(names, x)}
        data.update({n: t.numpy() for n, t in zip(tnames, labels)})
        loss_flags = []
    elif kind == "nll":
        export(train_model, (*x, labels), train_path, names + ["labels"], ["loss"], training,
               fold=False)
        data = {n: t.numpy() for n, t in zip(names, x)}
        data["labels"] = labels.numpy().astype(np.int64)
        loss_flags = []
    else:
        export(train_model, x, train_path, names, ["output"], training, fold=False)
        data = {n: t.numpy() for n, t in zip(names, x)}
        data["labels"] = labels.numpy().astype(np.int64)
        loss_flags = ["--loss", "cross-entropy"] + (["--loss-axis", "1"] if kind != "lm" else [])
    save(os.path.join(work, "train_in"), data)

    # PyTorch's steps on freshly built weights (a training export runs the model once).
    trained = {}
    ref = torch_losses(make, kind, x, labels, torch.float32, training, trained)
    ref64 = torch_losses(make, kind, x, labels, torch.float64, training) if opts.fp64 else None
    with open(log, "a") as f:
        f.write(f"{mode}: pytorch losses: {ref}\n{mode}: pytorch float64 losses: {ref64}\n")

    if not all(np.isfinite(ref)):
        res.update({"status": "PyTorch diverges", "error": f"PyTorch's losses: {ref}"})
        return res
    worst = worst64 = 0.0
    for d in (2, 4):
        plan = os.path.join(work, f"plan_train_{mode}_{d}")
        _, err, _ = run([stagec, train_path, "-o", plan, "--devices", str(d), "--batch", str(BATCH),
                         "--microbatches", str(TRAIN_MICROBATCHES), "--train", "--optimizer", "sgd",
                         "--lr", str(LR), "--device-spec", "cpu"] + loss_flags +
                        (["--schedule", SCHEDULE] if SCHEDULE else []) +
                        (["--chunks", "2"] if SCHEDULE == "interleaved" else []) +
                        [f for p in FREEZE.get(name, []) for f in ("--freeze", p)], log,
                        opts.timeout)
        if err:
            res.update({"status": f"FAIL@{d} (plan)", "error": err})
            return res
        exported = os.path.join(work, f"trained_{mode}_{d}.onnx")
        out, err, _ = run([stagerun, plan, "--steps", str(STEPS), "--inputs",
                           os.path.join(work, "train_in"), "--json", "-q", "--export", exported],
                          log, opts.timeout)
        if err:
            res.update({"status": f"FAIL@{d}", "error": err})
            return res
        # Losses can agree to 1e-7 while a weight that matters little in 3 steps never trains
        # (a position-bias table whose gradient a fusion dropped): each weight PyTorch moved
        # must move here too.
        frozen, found = untrained_weights(exported, trained)
        res["weights_checked"] = found
        if frozen:
            res.update({"status": f"UNTRAINED@{d}",
                        "error": f"{len(frozen)} of {found} weights never moved: "
                                 + ", ".join(frozen[:3]) + (" ..." if len(frozen) > 3 else "")})
            return res
        losses = [r["loss"] for r in map(json.loads, out.splitlines()) if r.get("type") == "step"]
        worst = max(worst, rel_err(losses, ref))
        if ref64:
            worst64 = max(worst64, rel_err(losses, ref64))
    res.update({"err": worst, "status": "ok" if worst <= LOSS_TOL else "DIFF"})
    if ref64:
        # The noise floor: how far PyTorch's own float32 run is from its float64 run. Where it
        # is above the tolerance, the training point is ill-conditioned (float32 rounding alone
        # moves the losses), and stagecraft's float32 run is judged against float64 like
        # PyTorch's: within 3x PyTorch's own distance counts as "fp32".
        floor = rel_err(ref, ref64)
        res.update({"floor": floor, "err64": worst64})
        if worst > LOSS_TOL and floor > LOSS_TOL / 3:
            spread = 3 * floor
            if worst64 > spread:
                # Past 3x: how far float32 alone moves these losses, from PyTorch's runs on
                # weights moved by one ulp (the rounding any float32 implementation may differ by).
                ulp = max(rel_err(torch_losses(one_ulp_moved(make, seed), kind, x, labels,
                                               torch.float32, training), ref64)
                          for seed in range(ULP_RUNS))
                res["ulp_spread"] = ulp
                spread = max(spread, ulp)
                with open(log, "a") as f:
                    f.write(f"{mode}: farthest of {ULP_RUNS} one-ulp PyTorch runs from float64: "
                            f"{ulp:.2e}\n")
            if worst64 <= spread:
                res["status"] = "fp32"
    return res


def one_ulp_moved(make, seed):
    """`make`, with each float32 parameter times 1 + or - 2^-23 (random sign, seeded)."""
    def moved():
        m = make()
        gen = torch.Generator().manual_seed(100 + seed)
        with torch.no_grad():
            for p in m.parameters():
                sign = torch.randint(0, 2, p.shape, generator=gen).double() * 2 - 1
                p.copy_((p.double() * (1 + sign * 2.0 ** -23)).to(p.dtype))
        return m
    return moved


def rel_err(got, ref):
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref))


def own_loss(model, kind):
    """The module trained: `model` wrapped in its own loss (features, nll), or `model` alone."""
    if kind == "features":
        return FeatureLoss(model)
    return NllLoss(model) if kind == "nll" else model


def torch_losses(make, kind, x, labels, dtype, training=True, trained=None):
    """PyTorch's own STEPS SGD steps, each over TRAIN_MICROBATCHES microbatches (loss / M), in
    train mode (BatchNorm on the microbatch's statistics) or eval mode (on running statistics).
    With a dict `trained`: each parameter's name -> its values before and after the steps."""
    model = make().to(dtype)
    train_model = own_loss(model, kind).to(dtype)
    # By the exported module's names (FeatureLoss's "m." prefix included).
    before = {n: p.detach().clone() for n, p in train_model.named_parameters()}
    train_model.train(training)
    x = tuple(t.to(dtype) if t.is_floating_point() else t for t in x)
    if kind == "features":
        labels = [t.to(dtype) for t in labels]
    opt = torch.optim.SGD(train_model.parameters(), lr=LR)
    losses = []
    mb = BATCH // TRAIN_MICROBATCHES
    for _ in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for m in range(TRAIN_MICROBATCHES):
            s = slice(m * mb, (m + 1) * mb)
            if kind == "features":
                loss = train_model(*[t[s] for t in x], *[t[s] for t in labels])
            elif kind == "nll":
                loss = train_model(*[t[s] for t in x], labels[s])
            else:
                y = train_model(*[t[s] for t in x])
                if kind == "lm":
                    loss = nn.functional.cross_entropy(y.reshape(-1, y.shape[-1]),
                                                       labels[s].reshape(-1))
                else:
                    loss = nn.functional.cross_entropy(y, labels[s])
            (loss / TRAIN_MICROBATCHES).backward()
            total += loss.item() / TRAIN_MICROBATCHES
        opt.step()
        losses.append(total)
    if trained is not None:
        for n, p in train_model.named_parameters():
            trained[n] = (before[n].numpy(), p.detach().numpy().copy())
    return losses


def untrained_weights(exported, trained):
    """The parameters PyTorch's steps moved that stagecraft's left exactly as they were (a
    weight whose gradient was dropped), by name, from the model `stagerun --export` wrote; and
    how many of PyTorch's parameters the file holds under their own name."""
    import onnx
    from onnx import numpy_helper
    inits = {t.name: t for t in onnx.load(exported).graph.initializer}
    frozen, found = [], 0
    for n, (before, after) in trained.items():
        t = inits.get(n)
        if t is None:
            continue
        got = numpy_helper.to_array(t)
        if got.shape != before.shape:
            continue
        found += 1
        moved = np.abs(after - before).max()
        if moved > 1e-7 * max(np.abs(before).max(), 1e-3) and np.array_equal(got, before):
            frozen.append(n)
    return frozen, found


def check_refused(name, opts):
    work = os.path.join(opts.work, name)
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "log.txt")
    open(log, "w").close()
    t0 = time.time()
    torch.manual_seed(0)
    model = REFUSED[name]().eval()
    path = os.path.join(work, name + ".onnx")
    x = torch.randn(1, 3, 128, 128)
    torch.onnx.export(model, ([x[0]],), path, opset_version=17, input_names=["input"],
                      do_constant_folding=True)
    stagec = os.path.join(opts.build, "tools", "stagec")
    out, err, _ = run([stagec, path, "--info"], log, opts.timeout)
    return {"family": "detection (full)", "model": name, "note": "eval export, one 128x128 image",
            "import": "refused" if err else "ACCEPTED", "plan": "-", "run": "-",
            "error": err or "",
            "seconds": time.time() - t0}


def loss_cell(row, key):
    if row.get(key + "_err") is None:
        return "-"
    ulp = row.get(key + "_ulp")
    return (f"{fmt_err(row[key + '_err'])} ({fmt_err(row.get(key + '_err64'))} / "
            f"{fmt_err(row.get(key + '_floor'))}"
            + (f"; one-ulp runs up to {fmt_err(ulp)}" if ulp is not None else "") + ")")


# Initializers to leave untrained (stagec --freeze), per model: torchvision's FrozenBatchNorm2d
# keeps its weight, bias and running statistics as buffers, which the ONNX file holds as
# ordinary float32 initializers.
FREEZE = {
    "fasterrcnn_resnet18_fpn_backbone": ["*.body.*bn*", "*.body.*.downsample.1.*"],
}


def fmt_err(v):
    return "-" if v is None else f"{v:.1e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the build folder with tools/stagec")
    ap.add_argument("--work", default="/tmp/stagecraft-torch-check", help="exports and plans go here")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--family", default="", help="only this family (e.g. classification)")
    ap.add_argument("--no-train", action="store_true", help="inference only")
    ap.add_argument("--no-refused", action="store_true", help="skip the full detection models")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per stagec/stagerun call")
    ap.add_argument("--json", default="", help="also write the rows to this JSON file")
    ap.add_argument("--no-fp64", dest="fp64", action="store_false",
                    help="skip PyTorch's float64 reference (the noise floor of the loss check)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    opts = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    if opts.list:
        for n, (fam, _, _, _, note) in MODELS.items():
            print(f"{fam:20} {n:38} {note}")
        for n in REFUSED:
            print(f"{'detection (full)':20} {n}")
        return
    names = [n for n in MODELS if (not opts.only or n in opts.only.split(","))
             and (not opts.family or MODELS[n][0] == opts.family)]
    refused = [n for n in REFUSED if not opts.no_refused and (not opts.only or n in opts.only.split(","))
               and (not opts.family or opts.family == "detection")]
    unknown = set(filter(None, opts.only.split(","))) - set(MODELS) - set(REFUSED)
    if unknown:
        sys.exit(f"unknown model(s): {', '.join(sorted(unknown))} (--list lists them)")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}; batch {BATCH}, "
          f"{STEPS} SGD steps at lr {LR} on {TRAIN_MICROBATCHES} microbatches; tolerance "
          f"{OUT_TOL:g} of the output's scale, {LOSS_TOL:g} relative for losses", flush=True)
    print("| family | model | import | plan | run | output err / scale | train | loss err (vs fp64 "
          "/ PyTorch fp32 vs fp64) | train, eval-mode BN | loss err (vs fp64 / PyTorch's) | s "
          "| first stagecraft error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for n in names + refused:
        try:
            row = check(n, opts) if n in MODELS else check_refused(n, opts)
        except Exception as e:  # an export PyTorch itself refuses
            row = {"family": MODELS[n][0] if n in MODELS else "detection (full)", "model": n,
                   "import": "-", "plan": "-", "run": "-", "seconds": 0.0,
                   "error": f"python: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        rows.append(row)
        print(f"| {row['family']} | {row['model']} | {row['import']} | {row['plan']} | {row['run']} "
              f"| {fmt_err(row.get('out_err'))} | {row.get('train', '-')} | {loss_cell(row, 'train')} "
              f"| {row.get('train_eval', '-')} | {loss_cell(row, 'train_eval')} "
              f"| {row['seconds']:.0f} | {row['error'].replace('|', '/')} |", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
