#!/usr/bin/env bash
# GPU check for packer.attention (not part of CI): the CUDA equivalence tests against the flash_attn and
# torch_varlen backends (skipped, with the reason printed, where flash-attn is absent), then the attention
# benchmark in bf16, and the training benchmark in bf16. Runs in well under 5 minutes on one GPU.
#   bash benchmarks/gpu_check.sh            (PYTHON=... to pick the interpreter that has CUDA torch)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" - <<'PY'
import torch
from packer.attention import available_backends
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA")
for name, info in available_backends("cuda").items():
    print(f"  {name:<13} forward={info['forward']} backward={info['backward']}  {info['note']}")
PY
timeout 150 "$PY" -m pytest tests/train/test_attention.py -k cuda -q -rs -p no:cacheprovider
timeout 150 "$PY" -m pytest tests/train/test_hf.py -k cuda -q -rs -p no:cacheprovider  # HF flash_attention_2 exactness
# role policies: FlexAttention forward+backward against the float64 hybrid-mask reference, then its speed
# (added 2026-12-03 with docs/role_masks.md; not yet run on a GPU)
timeout 200 "$PY" -m pytest tests/train/test_attention_roles.py -k cuda -q -rs -p no:cacheprovider
timeout 200 "$PY" benchmarks/bench_role_mask.py --device cuda --dtype bf16
timeout 240 "$PY" benchmarks/bench_attention.py --device cuda --dtype bf16
# training throughput, padded vs packed vs varlen (the seeds' table), a GPU-sized model in bf16
# (added after the 2026-11-29 H200 run, whose lease ended first: checked on CPU only, bf16 autocast)
timeout 240 "$PY" benchmarks/bench_train.py --device cuda --dtype bf16 --dim 1024 --layers 8 --heads 16 --tokens 262144 --threads 0
