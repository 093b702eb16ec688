#!/usr/bin/env bash
# GPU check for packer (not part of CI), in the order of what was never measured first: packed-vs-padded
# training tokens/s, the role-mask FlexAttention tests and benchmark, the CUDA equivalence tests of the
# varlen backends, the attention benchmark, HF flash_attention_2 (skipped where flash-attn is absent).
# Every step runs even when one before it fails; the exit status counts the failed steps. Worst case (every
# step at its timeout) 13 minutes with the cost-model fits; about 4 expected on an H200.
#   bash benchmarks/gpu_check.sh            (PYTHON=... to pick the interpreter that has CUDA torch)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
failed=()
step() {  # step SECONDS NAME COMMAND...: run with a timeout, note a failure, go on
    local limit=$1 name=$2; shift 2
    echo; echo "=== $name ($(date -u +%T), limit ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@"; local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" - <<'PY'
import torch
from packer.attention import available_backends
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "NO CUDA")
for name, info in available_backends("cuda").items():
    print(f"  {name:<13} forward={info['forward']} backward={info['backward']}  {info['note']}")
PY
# training throughput, padded vs packed vs varlen (the seeds' table), a GPU-sized model in bf16
step 120 bench_train "$PY" benchmarks/bench_train.py --device cuda --dtype bf16 --dim 1024 --layers 8 --heads 16 --tokens 262144 --threads 0
# role policies: FlexAttention forward+backward against the float64 hybrid-mask reference, then its speed
step 90 test_attention_roles "$PY" -m pytest tests/train/test_attention_roles.py -k cuda -q -rs -p no:cacheprovider
step 60 bench_role_mask "$PY" benchmarks/bench_role_mask.py --device cuda --dtype bf16
step 90 test_attention "$PY" -m pytest tests/train/test_attention.py -k cuda -q -rs -p no:cacheprovider
step 90 bench_attention "$PY" benchmarks/bench_attention.py --device cuda --dtype bf16
step 45 test_hf "$PY" -m pytest tests/train/test_hf.py -k cuda -q -rs -p no:cacheprovider  # HF flash_attention_2 exactness
# context-parallel layouts (ItemFields(pad_multiple=K)): varlen_attention on masks.padded_segments, and Transformer
# Engine's THD attention given cu_seqlens / cu_seqlens_padded (where it imports), against each document alone
step 60 test_items_padded "$PY" -m pytest tests/train/test_items_padded.py -k cuda -q -rs -p no:cacheprovider
# Megatron THD: packed_seq_params on CUDA batches makes no device sync (torch.cuda.set_sync_debug_mode("error"))
if "$PY" -c "import megatron.core" >/dev/null 2>&1; then
    step 60 test_megatron_no_sync "$PY" -m pytest tests/train/test_megatron_adapter.py -k no_device_sync_cuda -q -rs \
        -p no:cacheprovider
fi
# Megatron THD: Transformer Engine's DotProductAttention (qkv_format="thd") given packer's PackedSeqParams, as
# Megatron's TEDotProductAttention passes them, against packer's varlen_attention and a float64 per-document reference
if "$PY" -c "import transformer_engine.pytorch, megatron.core" >/dev/null 2>&1; then
    step 120 test_megatron_te "$PY" -m pytest tests/train/test_megatron_adapter.py -k "cuda and not no_device_sync" -q -rs \
        -p no:cacheprovider
else
    echo; echo "=== test_megatron_te: skipped: transformer_engine or megatron-core does not import here" \
        "(pip install megatron-core 'transformer-engine[pytorch]' on the CUDA box to run it)"
fi
# torchtitan 0.3: its own mask helpers and VarlenAttention, given the metadata it makes from packer's positions,
# against packer's boundaries, varlen_attention and a float64 per-document reference (needs triton: GPU only)
if "$PY" -c "import torchtitan.models.common.attention" >/dev/null 2>&1; then
    step 90 test_torchtitan "$PY" -m pytest tests/train/test_torchtitan.py -q -rs -p no:cacheprovider
else
    echo; echo "=== test_torchtitan: skipped: torchtitan's models/common/attention.py does not import here" \
        "(pip install torchtitan==0.3.0 on the CUDA box to run it)"
fi
# step balance (issue 37): time forward+backward on rows of different cost (tokens, squared document lengths) and
# fit CostModel(per_token, per_pair, per_row) with its R^2: packer's tiny model, then one Llama-8B-shaped layer
# (d_model 4096, 32 heads, 8 KV heads; a 4x GELU MLP) on the auto varlen backend, bf16
step 120 fit_cost_tiny "$PY" benchmarks/bench_balance.py --fit --device cuda --shape tiny --context 16384
step 180 fit_cost_llama_layer "$PY" benchmarks/bench_balance.py --fit --device cuda --shape llama-layer --context 32768
echo
if [ ${#failed[@]} -eq 0 ]; then echo "gpu_check: every step passed"; exit 0; fi
printf 'gpu_check: failed: %s\n' "${failed[@]}"
exit "${#failed[@]}"
