#!/usr/bin/env bash
# Issue 6's GPU checks in one run, for a session lent the device machine (about 5 minutes on an H200):
#   1. lmcost calibrate --device cuda: roofs and the efficiency model fitted on this GPU;
#   2. validate Llama-3-8B dimensions (2 layers, bf16, batch 1/8/64, prompt 2048, decode at 2049) with
#      the calibrated YAML: roofline and calibrated errors per class, whole prefill, one decode step;
#   3. benchmarks/op_accuracy.py with the shipped YAML of this GPU and with the calibrated one.
# Writes at most 8 files under the folder given (the device tool's limit): calibrated.yaml, the
# validate report and its per-operator CSVs, two op-accuracy reports.
#
# On the device machine, python3 has torch but not pydantic: carry its wheels (.whl, see
# .library/device/README.md: pydantic, pydantic-core, annotated-types, typing-inspection) and start with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# then: bash benchmarks/gpu_check.sh "$OUT"
# Smoke test on a CPU: DEVICE=cpu MODEL=tiny-gqa BATCH=1 PROMPT=32 bash benchmarks/gpu_check.sh /tmp/check
set -euo pipefail
out=${1:?give the output folder}
device=${DEVICE:-cuda}
model=${MODEL:-llama-3-8b}
batch=${BATCH:-1,8,64}
prompt=${PROMPT:-2048}
dtype=${DTYPE:-$([ "$device" = cpu ] && echo fp32 || echo bf16)}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
lmcost() { python3 -m lmcost "$@"; }

shipped=$(python3 - "$device" <<'PY'
import sys, torch
name = torch.cuda.get_device_name() if sys.argv[1].startswith("cuda") else ""
print(next((g for key, g in (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100"), ("A100-SXM4-40GB", "a100-40gb"),
                              ("A100", "a100")) if key in name), ""))
PY
)
echo "device: $device; shipped YAML for it: ${shipped:-none}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv 2>/dev/null || true

lmcost calibrate --device "$device" --dtypes "$dtype" -o "$out/calibrated.yaml"   # fp32 is always measured
rep=$(mktemp -d)
trap 'rm -rf "$rep"' EXIT
lmcost validate "$model" --device "$device" --dtype "$dtype" --layers 2 --batch "$batch" --prompt "$prompt" --gen 8 \
  --repeats 5 --gpu "$out/calibrated.yaml" --report-dir "$rep"
cp "$rep"/validate-*.md "$rep"/validate-ops-*.csv "$out"/
python3 benchmarks/op_accuracy.py --gpu "$out/calibrated.yaml" --device "$device" --dtype "$dtype" --out "$out/op-accuracy-calibrated.md"
if [ -n "$shipped" ]; then
  python3 benchmarks/op_accuracy.py --gpu "$shipped" --device "$device" --dtype "$dtype" --out "$out/op-accuracy-$shipped.md"
fi
ls -l "$out"
