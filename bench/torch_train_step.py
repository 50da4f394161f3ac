#!/usr/bin/python3
"""PyTorch side of bench/resnet50_training.sh: the same ResNet-50 training run in PyTorch on
one device, for comparison with stagerun's single-device plan.

    torch_train_step.py --batch 120 --image 128 --classes 1000 --lr 0.001 --batches 3
                        --repeat R --threads T --variant folded|batchnorm

One run = --batches training steps (forward, MSE loss against one-hot-sized random labels,
backward, SGD step with lr --lr) on one fixed random batch, timed with time.perf_counter
around the whole run; a warm-up run comes first and is not reported. Prints one JSON object:
{variant, batch, image, threads, run_s [R values], median_run_s, step_s [per step of every
run], losses [of the last run]}.

Variants:
  folded     torchvision's resnet50 with every BatchNorm folded into the convolution before it
             (torch.nn.utils.fusion.fuse_conv_bn_eval): the same computation as the ONNX export
             stagecraft trains (the exporter folds BatchNorm in eval mode), so the like-for-like
             comparison.
  batchnorm  the unmodified resnet50 in train mode (BatchNorm with batch statistics): what a
             PyTorch user would run; more work per step than the folded model.

Uses Debian's python3-torch and python3-torchvision (/usr/bin/python3); exits 3 with a message
when they are missing.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
    import torchvision
    from torch.nn.utils.fusion import fuse_conv_bn_eval
except ImportError as e:  # pragma: no cover
    print(f"torch_train_step.py: needs python3-torch and python3-torchvision ({e})", file=sys.stderr)
    sys.exit(3)


def folded_resnet50():
    model = torchvision.models.resnet50().eval()
    model.conv1 = fuse_conv_bn_eval(model.conv1, model.bn1)
    model.bn1 = torch.nn.Identity()
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            for k in (1, 2, 3):
                conv, bn = getattr(block, f"conv{k}"), getattr(block, f"bn{k}")
                setattr(block, f"conv{k}", fuse_conv_bn_eval(conv, bn))
                setattr(block, f"bn{k}", torch.nn.Identity())
            if block.downsample is not None:
                block.downsample = torch.nn.Sequential(
                    fuse_conv_bn_eval(block.downsample[0], block.downsample[1]))
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=120)
    ap.add_argument("--image", type=int, default=128)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variant", choices=["folded", "batchnorm"], default="folded")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = folded_resnet50() if a.variant == "folded" else torchvision.models.resnet50().train()
    x = torch.randn(a.batch, 3, a.image, a.image)
    y = torch.randn(a.batch, a.classes)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    loss_fn = torch.nn.MSELoss()

    def run():
        steps, losses = [], []
        for _ in range(a.batches):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            steps.append(time.perf_counter() - t0)
            losses.append(loss.item())
        return steps, losses

    run()  # warm-up
    runs, all_steps, losses = [], [], []
    for _ in range(a.repeat):
        steps, losses = run()
        runs.append(sum(steps))
        all_steps += steps
    print(json.dumps({"variant": a.variant, "batch": a.batch, "image": a.image,
                      "threads": a.threads, "run_s": runs, "median_run_s": statistics.median(runs),
                      "step_s": all_steps, "losses": losses}))


if __name__ == "__main__":
    main()
