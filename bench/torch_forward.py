#!/usr/bin/python3
"""PyTorch side of bench/forward_vs_pytorch.sh: forward (inference) timing and the reference
outputs for the numerical cross-check of stagerun.

The models are built by samples/scripts/export_torch_models.py (imported, not copied):
torchvision's resnet50 and its GPT-style decoder, so PyTorch times exactly the modules whose
ONNX exports stagecraft runs.

    torch_forward.py time  MODEL --batch B [--seq S] --threads T [--steps N] [--warmup W]
                           [--mode eager|mkldnn]
        Prints one JSON object: {model, mode, batch, threads, blas, step_ms [...],
        median_step_ms, samples_per_s}. torch.set_num_threads(T), torch.inference_mode(),
        W warm-up steps, then the median of N timed steps (time.perf_counter around the call).
        --mode mkldnn (ResNet-50 only) times torch.utils.mkldnn.to_mkldnn(model) on an
        mkldnn input (PyTorch's own oneDNN inference path: weights packed once, the input and
        output reorders inside the timed region).
    torch_forward.py export MODEL --batch B [--seq S] --out DIR [--seed K]
        Seeds, builds the model (ResNet-50 BatchNorms get random statistics and affine
        parameters so they are not identities), exports DIR/model.onnx (opset 17, symbolic
        batch/seq as the export script does), writes DIR/input.npy and the PyTorch output for
        that input, DIR/reference.npy (eval mode, inference_mode).
    torch_forward.py compare REFERENCE.npy OUTPUT.npy
        Prints {max_abs_diff, max_abs_ref, max_rel_diff, shape} as JSON; exits 1 when the
        shapes differ.

Uses Debian's python3-torch (/usr/bin/python3); exits 3 with a message when torch is missing.
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

try:
    import numpy as np
    import torch
    import torchvision  # noqa: F401  (the export script needs it)
except ImportError as e:  # pragma: no cover
    print(f"torch_forward.py: PyTorch not available ({e}); install python3-torch python3-torchvision",
          file=sys.stderr)
    sys.exit(3)

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORT_SCRIPT = os.path.join(HERE, "..", "samples", "scripts", "export_torch_models.py")


def export_module():
    spec = importlib.util.spec_from_file_location("export_torch_models", EXPORT_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(name, batch, seq, randomize_bn=False):
    ex = export_module()
    if name == "resnet50":
        model = torchvision.models.resnet50()
        if randomize_bn:
            g = torch.Generator().manual_seed(1234)
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    c = m.num_features
                    m.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                    m.running_var.copy_(0.5 + torch.rand(c, generator=g))
                    m.weight.data.copy_(0.5 + 0.5 * torch.rand(c, generator=g))
                    m.bias.data.copy_(0.1 * torch.randn(c, generator=g))
        x = torch.randn(batch, 3, 224, 224)
        dynamic = {0: "batch"}
    elif name == "gpt":
        model = ex.GPT()
        x = torch.randint(0, 1024, (batch, seq))
        dynamic = {0: "batch", 1: "seq"}
    else:
        raise SystemExit(f"torch_forward.py: unknown model {name!r} (resnet50 or gpt)")
    model.eval()
    return ex, model, x, dynamic


def blas_name():
    """Which BLAS the process mapped: Debian's torch calls the libblas.so.3 alternative."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
    except OSError:
        return "unknown"
    if any("openblas" in p for p in libs):
        return "OpenBLAS"
    if any("/blas/libblas.so" in p for p in libs):
        return "netlib (reference)"
    return ",".join(sorted(os.path.basename(p) for p in libs)) or "none mapped"


def cmd_time(a):
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    _, model, x, _ = build(a.model, a.batch, a.seq)
    if a.mode == "mkldnn":
        if a.model != "resnet50":
            raise SystemExit("torch_forward.py: --mode mkldnn is for resnet50 only")
        from torch.utils import mkldnn as mkldnn_utils
        model = mkldnn_utils.to_mkldnn(model)

        def step():
            return model(x.to_mkldnn()).to_dense()
    else:
        def step():
            return model(x)
    times = []
    with torch.inference_mode():
        for i in range(a.warmup + a.steps):
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            if i >= a.warmup:
                times.append((t1 - t0) * 1e3)
    med = statistics.median(times)
    print(json.dumps({"model": a.model, "mode": a.mode, "batch": a.batch, "seq": a.seq,
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "blas": blas_name(), "step_ms": times, "median_step_ms": med,
                      "samples_per_s": a.batch / (med / 1e3)}))


def cmd_export(a):
    torch.manual_seed(a.seed)
    ex, model, x, dynamic = build(a.model, a.batch, a.seq, randomize_bn=True)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "model.onnx")
    torch.onnx.export(model, x, path, opset_version=17, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": dynamic, "output": dynamic}, do_constant_folding=True)
    with torch.inference_mode():
        y = model(x)
    np.save(os.path.join(a.out, "input.npy"), x.numpy())
    np.save(os.path.join(a.out, "reference.npy"), y.numpy())
    print(f"{path}: input {tuple(x.shape)} {x.dtype}, reference output {tuple(y.shape)}")


def cmd_compare(a):
    ref = np.load(a.reference)
    out = np.load(a.output)
    if ref.shape != out.shape:
        print(json.dumps({"error": f"shape {list(out.shape)} != reference {list(ref.shape)}"}))
        sys.exit(1)
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    max_ref = float(np.abs(ref).max())
    print(json.dumps({"shape": list(ref.shape), "max_abs_diff": float(diff.max()), "max_abs_ref": max_ref,
                      "max_rel_diff": float(diff.max() / max_ref) if max_ref > 0 else 0.0,
                      "finite": bool(np.isfinite(out).all())}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("model")
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--seq", type=int, default=128)
    t.add_argument("--threads", type=int, required=True)
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--mode", choices=["eager", "mkldnn"], default="eager")
    e = sub.add_parser("export")
    e.add_argument("model")
    e.add_argument("--batch", type=int, required=True)
    e.add_argument("--seq", type=int, default=128)
    e.add_argument("--out", required=True)
    e.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare")
    c.add_argument("reference")
    c.add_argument("output")
    a = p.parse_args()
    {"time": cmd_time, "export": cmd_export, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    main()
