#!/usr/bin/env python3
"""PyTorch side of bench/gpu_vs_pytorch.sh: one-GPU training steps of the models stagerun trains
there, timed the same way (the median of the steps after the warm-up ones).

    torch_gpu_step.py gpt2 --batch 8 --seq 1024 --mode eager|compile --precision bf16|fp32
    torch_gpu_step.py resnet50 --batch 64 --image 224 --mode eager|compile --precision bf16|fp32
    torch_gpu_step.py export-resnet50 OUT.onnx --image 224

Models (random weights, no download):
  gpt2      GPT-2 small's shape, as `stagecraft-make-samples gpt --layers 12 --width 768
            --heads 12 --vocab 50257 --tied` builds it: token + position embeddings, 12 pre-norm
            blocks (LayerNorm, causal attention, GELU (erf) MLP), final LayerNorm, head tied to
            the token embedding; cross-entropy against random tokens. Attention is
            F.scaled_dot_product_attention(is_causal=True), what a PyTorch user writes.
  resnet50  torchvision's resnet50 with every BatchNorm folded into its convolution (what the
            ONNX export gives stagecraft, so the same computation); MSE against random
            [batch, 1000] targets.
Both train with AdamW, lr 1e-3 (stagec's default optimizer and rate).

Precision: bf16 is torch.autocast(bfloat16) with fp32 master weights (PyTorch's mixed
precision); fp32 turns TF32 off for cuBLAS and cuDNN, as stagecraft's CUDA backend computes.
Each step is timed with CUDA events around forward, backward and optimizer step; --warmup steps
(compilation included for --mode compile) come first and are not reported. Prints one JSON
object: model, mode, precision, batch, step_ms [each timed step], median_step_ms,
peak_bytes (torch.cuda.max_memory_allocated), final_loss, parameters, compile_s.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = torch.nn.LayerNorm(width)
        self.c_attn = torch.nn.Linear(width, 3 * width)
        self.c_proj = torch.nn.Linear(width, width)
        self.ln_2 = torch.nn.LayerNorm(width)
        self.c_fc = torch.nn.Linear(width, 4 * width)
        self.mlp_proj = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(torch.nn.Module):
    def __init__(self, layers=12, width=768, heads=12, vocab=50257, context=1024):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        # GPT-2's initialisation (normal, std 0.02): with the tied head, nn.Embedding's std 1
        # would start the loss near 90 instead of ln(vocabulary).
        for module in self.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied head, as GPT-2


def folded_resnet50():
    import torchvision
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    model = torchvision.models.resnet50().eval()

    def fold(module):
        for name, child in list(module.named_children()):
            fold(child)
        children = list(module.named_children())
        for (name, child), (next_name, next_child) in zip(children, children[1:]):
            if isinstance(child, torch.nn.Conv2d) and isinstance(next_child, torch.nn.BatchNorm2d):
                setattr(module, name, fuse_conv_bn_eval(child, next_child))
                setattr(module, next_name, torch.nn.Identity())

    fold(model)
    # Bottleneck and the downsample Sequential name their pairs conv1/bn1..., which the
    # sibling pass above covers; the stem is conv1/bn1 of the model itself.
    leftover = [n for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    if leftover:
        sys.exit(f"torch_gpu_step.py: BatchNorm not folded: {leftover[:3]}")
    return model.train()


def export_resnet50(path, image):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().eval()
    example = torch.randn(1, 3, image, image)
    kwargs = dict(opset_version=17, input_names=["input"], output_names=["output"],
                  dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                  do_constant_folding=True)
    try:
        # The TorchScript exporter folds BatchNorm into the convolutions in eval mode.
        torch.onnx.export(model, example, path, dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(model, example, path, **kwargs)
    print(json.dumps({"exported": path}))


def write_kernels(step, path):
    """One step under torch.profiler (CUDA activity only): device time per kernel name."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us and e.count and "DeviceType.CUDA" in str(getattr(e, "device_type", "")):
            kernels.append({"name": e.key, "count": e.count, "total_us": us})
    with open(path, "w") as f:
        json.dump(kernels, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt2", "resnet50", "export-resnet50"])
    ap.add_argument("path", nargs="?")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kernels", metavar="FILE",
                    help="after the timed steps, one more step under torch.profiler: its device "
                         "time per kernel name, as JSON, to FILE (bench/kernel_table.py reads it)")
    a = ap.parse_args()
    if a.model == "export-resnet50":
        export_resnet50(a.path, a.image)
        return

    torch.manual_seed(0)
    dev = torch.device("cuda")
    if a.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if a.model == "gpt2":
        model = GPT(context=a.seq).to(dev)
        x = torch.randint(0, 50257, (a.batch, a.seq), device=dev)
        y = torch.randint(0, 50257, (a.batch, a.seq), device=dev)
        loss_fn = lambda out: F.cross_entropy(out.float().view(-1, out.shape[-1]), y.view(-1))
    else:
        model = folded_resnet50().to(dev)
        x = torch.randn(a.batch, 3, a.image, a.image, device=dev)
        y = torch.randn(a.batch, 1000, device=dev)
        loss_fn = lambda out: F.mse_loss(out.float(), y)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model) if a.mode == "compile" else model

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = loss_fn(fwd(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    if a.kernels:
        write_kernels(step, a.kernels)
    print(json.dumps({"model": a.model, "mode": a.mode, "precision": a.precision,
                      "batch": a.batch, "step_ms": times,
                      "median_step_ms": statistics.median(times),
                      "peak_bytes": torch.cuda.max_memory_allocated(),
                      "final_loss": float(loss), "parameters": params,
                      "warmup_s": warm_s, "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
