#!/usr/bin/env bash
# readme_pytorch_test.sh TOOLS_DIR WORKDIR: the README's "Your own PyTorch model in six commands"
# as a user runs them, on a fresh PyTorch model nobody here exported before (an embedding, a
# 2-layer nn.TransformerEncoder with Dropout, a Linear head): export in training mode, --info,
# plan 2-device training with --profile cpu, train 100 steps with checkpoints, --export, and
# load_state_dict back into PyTorch. Checks that every parameter comes back by its state_dict
# name, that all of them changed, and that PyTorch's own eval loss on the training data fell.
# Needs Debian's python3-torch and python3-onnx (not installed by tools/setup.sh: exit 77,
# skipped, without them).
set -euo pipefail
tools=$1 work=$2
py=/usr/bin/python3
if ! "$py" -c "import torch, onnx" 2>/dev/null; then
  echo "SKIP: no python3-torch / python3-onnx (apt-get install python3-torch python3-onnx)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cat >model.py <<'PY'
import torch, torch.nn as nn
class MyModel(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(1024, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
        s.enc = nn.TransformerEncoder(layer, 2)
        s.head = nn.Linear(64, 1024)
    def forward(s, ids):
        return s.head(s.enc(s.emb(ids)))
PY
# 1. Export with the README's flags; data: 4 batches of 8 rows of 32 tokens, next-token labels.
"$py" - <<'PY' 2>&1 | grep -v -i warn || true
import os, numpy as np, torch
from model import MyModel
torch.manual_seed(0)
model = MyModel()
torch.save(model.state_dict(), "initial.pt")
ids = torch.randint(0, 1024, (2, 16))
model.train()
torch.onnx.export(model, ids, "model.onnx", opset_version=17,
                  input_names=["input_ids"], output_names=["logits"],
                  dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                "logits": {0: "batch", 1: "seq"}},
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
x = np.random.default_rng(0).integers(0, 1024, (4 * 8, 33))
os.makedirs("data", exist_ok=True)
np.save("data/input_ids.npy", x[:, :32].astype(np.int64))
np.save("data/labels.npy", x[:, 1:].astype(np.int64))
PY
[ -s model.onnx ] || { echo "FAIL: the export wrote no model.onnx" >&2; exit 1; }
# 2-6 as the README writes them.
"$tools/stagec" model.onnx --info --batch 8 --dim seq=32
"$tools/stagec" model.onnx -o plan --devices 2 --train --loss cross-entropy \
  --optimizer adamw --lr 0.001 --batch 8 --microbatches 4 --dim seq=32 --profile cpu
"$tools/stagedump" plan --html plan.html
"$tools/stagerun" plan --steps 100 --data data --checkpoint ckpt --save-every 50 -q
"$tools/stagerun" plan --steps 0 --resume ckpt --export trained.onnx
"$py" - <<'PY' 2>&1 | grep -v -i warn
import sys, numpy as np, onnx, torch
from onnx import numpy_helper
from model import MyModel
model = MyModel()
model.load_state_dict(torch.load("initial.pt"))
state = model.state_dict()
before = {k: v.clone() for k, v in state.items()}
trained = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
           for t in onnx.load("trained.onnx").graph.initializer if t.name in state}
model.load_state_dict(trained, strict=False)
params = {k for k, _ in model.named_parameters()}
missing = sorted(params - trained.keys())
changed = [k for k in params if not torch.equal(before[k], model.state_dict()[k])]
x = torch.from_numpy(np.load("data/input_ids.npy"))
y = torch.from_numpy(np.load("data/labels.npy"))
def loss(m):
    m.eval()
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(m(x).reshape(-1, 1024), y.reshape(-1)).item()
initial = MyModel()
initial.load_state_dict(torch.load("initial.pt"))
a, b = loss(initial), loss(model)
print(f"parameters back by name: {len(params) - len(missing)} of {len(params)}; changed: "
      f"{len(changed)}; PyTorch eval loss {a:.4f} -> {b:.4f}")
if missing: sys.exit(f"FAIL: not in trained.onnx by their state_dict names: {missing}")
if len(changed) != len(params): sys.exit("FAIL: some parameters did not train")
if not b < a - 1.0: sys.exit(f"FAIL: PyTorch's loss did not fall by 1 ({a:.4f} -> {b:.4f})")
PY
echo "ok: the README's six commands, round trip into PyTorch"
