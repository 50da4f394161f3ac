#!/usr/bin/python3
"""PyTorch side of bench/gpt_train_vs_pytorch.sh: a GPT training step on the CPU.

    torch_gpt_train_step.py --batch 8 --seq 128 --steps 8 --threads T [--layers 4 --width 256
                            --heads 8 --vocab 1024]

The model is samples/scripts/export_torch_models.py's GPT (the module stagecraft's side
exports): token and position embeddings, pre-norm blocks of nn.MultiheadAttention (causal mask)
and a GELU MLP, an LM head. One step = forward on one fixed batch of random token ids,
cross-entropy against random labels (mean over the batch's tokens), backward, Adam (lr 1e-3),
zero_grad; timed with time.perf_counter around each step after one warm-up step. Prints one
JSON object: {threads, batch, seq, step_ms [every timed step], median_step_ms, losses}.

Uses Debian's python3-torch (/usr/bin/python3); exits 3 with a message when it is missing.
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(f"torch_gpt_train_step.py: needs python3-torch ({e})", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "samples",
                                "scripts"))
from export_torch_models import GPT  # noqa: E402  (the module the ONNX side is exported from)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(args.layers, args.width, args.heads, args.vocab, max(args.seq, 128)).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    labels = torch.randint(0, args.vocab, (args.batch, args.seq))

    def step():
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.item()

    step()  # warm-up
    times, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        losses.append(step())
        times.append((time.perf_counter() - start) * 1000)
    print(json.dumps({"threads": args.threads, "batch": args.batch, "seq": args.seq,
                      "step_ms": times, "median_step_ms": statistics.median(times),
                      "losses": losses}))


if __name__ == "__main__":
    main()
