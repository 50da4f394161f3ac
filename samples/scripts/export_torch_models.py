#!/usr/bin/python3
"""Exports real PyTorch models to ONNX (opset 17) for manual checks and benchmarks.

Uses Debian's python3-torch and python3-torchvision (not needed by the tests):
    apt-get install python3-torch python3-torchvision
    /usr/bin/python3 samples/scripts/export_torch_models.py OUT_DIR [resnet50 mobilenet_v3 vit_b_16 gpt]

resnet50_128 is ResNet-50 at 3x128x128 (bench/resnet50_training.sh); it is not in the default set.
Weights are random (no download); batch (and sequence for gpt) are exported as symbolic dims,
so bind them with stagec's --batch and --dim seq=N.
"""
import sys
import os

import torch
import torchvision


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    """A GPT-2-style decoder: token + position embeddings, pre-norm blocks, LM head."""

    def __init__(self, layers=4, width=256, heads=8, vocab=1024, context=128):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        seq = ids.shape[1]
        pos = torch.arange(seq, device=ids.device).unsqueeze(0)
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        x = self.wte(ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln_f(x))


def export(name, model, example, out_dir, dynamic):
    path = os.path.join(out_dir, name + ".onnx")
    model.eval()
    torch.onnx.export(model, example, path, opset_version=17, input_names=["input"],
                      output_names=["output"], dynamic_axes={"input": dynamic, "output": dynamic},
                      do_constant_folding=True)
    print(f"{path}: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{os.path.getsize(path) / 2**20:.1f} MiB")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    wanted = sys.argv[2:] or ["resnet50", "mobilenet_v3", "vit_b_16", "gpt"]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    image = torch.randn(1, 3, 224, 224)
    if "resnet50" in wanted:
        export("resnet50", torchvision.models.resnet50(), image, out_dir, {0: "batch"})
    if "resnet50_128" in wanted:
        # The classic model-parallel experiment's input: 3x128x128 images, 1000 classes.
        torch.manual_seed(0)
        export("resnet50_128", torchvision.models.resnet50(), torch.randn(1, 3, 128, 128), out_dir,
               {0: "batch"})
    if "mobilenet_v3" in wanted:
        export("mobilenet_v3", torchvision.models.mobilenet_v3_large(), image, out_dir, {0: "batch"})
    if "vit_b_16" in wanted:
        export("vit_b_16", torchvision.models.vit_b_16(), image, out_dir, {0: "batch"})
    if "gpt" in wanted:
        ids = torch.randint(0, 1024, (2, 16))
        export("gpt", GPT(), ids, out_dir, {0: "batch", 1: "seq"})


if __name__ == "__main__":
    main()
