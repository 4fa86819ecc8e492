#!/usr/bin/env bash
# Issue 6's GPU checks in one run, for a session lent the device machine (about 5 minutes on an H200;
# every stage has a time limit, and the whole run stops within 8 minutes):
#   0. env.txt: nvidia-smi, the Python, torch, CUDA, cuDNN and Triton versions, the GPU torch sees, the SDPA
#      backend the reference decoder pins for the model, and the lmcost commit;
#   1. lmcost calibrate --device cuda: roofs and the efficiency model fitted on this GPU;
#   2. validate Llama-3-8B dimensions (2 layers, bf16, batch 1/8/64, prompt 2048, decode at 2049) with
#      the calibrated YAML: roofline and calibrated errors per class, whole prefill, one decode step;
#   3. benchmarks/op_accuracy.py with the calibrated YAML and with the shipped YAML of this GPU
#      (torch.compile fuses SiLU-and-mul and RoPE where it works at the first call, else they run eager).
# Writes everything under the folder given, at most 8 files (the device tool's limit): env.txt, log.txt
# (every stage's output, then one line per stage: exit status and seconds), calibrated.yaml,
# validate-<model>-<device>-<dtype>.md, validate-ops.csv (the per-operator CSVs of all batches, one
# `file` column naming each), op-accuracy-calibrated.md and op-accuracy-<gpu>.md. A failed or timed-out
# stage is logged and the next one still runs (validate and op accuracy fall back on the shipped YAML
# when calibration failed); the script exits non-zero if any stage failed.
#
# Installs nothing from a registry (the device machine reaches none). Its python3 has torch, numpy,
# pandas, pyyaml, rich, typer, sympy and humanize (/work/.library/device/KINDS.md), but not pydantic.
# Carry pydantic's wheels, built for the device's Python (3.12, x86-64 manylinux), in .wheels/ (ignored
# by git). Here, in the repository root, once:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .wheels pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     typing-extensions==4.16.0 typer==0.29.2
# (pyproject's pydantic>=2.5 as resolved here; pydantic pins its pydantic-core exactly; typing-extensions
# is carried as pydantic needs a recent one; typer as the device's own lacked typer._click.Path on 2026-12-04;
# keep one version of each). When a module lmcost imports is
# missing, this script installs .wheels/*.whl with `pip install --no-index --no-deps --target` into a
# temporary folder and puts it on PYTHONPATH; without .wheels it stops and says so.
# On the device machine (the device tool's `run`): command "bash benchmarks/gpu_check.sh $OUT",
# carry [".wheels"], timeout_s 540.
#
# Smoke test on a CPU (quick calibration):
#   DEVICE=cpu MODEL=tiny-gqa BATCH=1 PROMPT=32 bash benchmarks/gpu_check.sh /tmp/check
# Settings: DEVICE (cuda), MODEL (llama-3-8b), BATCH (1,8,64), PROMPT (2048), DTYPE (bf16; fp32 on a CPU),
# PYTHON (python3, or .venv/bin/python where it has torch), BUDGET_S (450: seconds for all stages).
set -uo pipefail
out=${1:?give the output folder}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
device=${DEVICE:-cuda}
model=${MODEL:-llama-3-8b}
batch=${BATCH:-1,8,64}
prompt=${PROMPT:-2048}
dtype=${DTYPE:-$([ "$device" = cpu ] && echo fp32 || echo bf16)}
quick=$([ "$device" = cpu ] && echo --quick || true)
deadline=$(( $(date +%s) + ${BUDGET_S:-450} ))
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' 2>/dev/null; then PYTHON=.venv/bin/python; fi
fi
log="$out/log.txt"
tmp=$(mktemp -d /tmp/gpu-check.XXXX)
trap 'rm -rf "$tmp"' EXIT
: >"$log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0
summary=()

# stage NAME LIMIT_S CMD...: run CMD with at most LIMIT_S seconds (less if the budget is nearly spent),
# its output appended to log.txt; record its exit status (124: timed out) and time.
stage() {
  local name=$1 limit=$2 left start rc
  shift 2
  left=$(( deadline - $(date +%s) ))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then
    summary+=("$name: skipped (time budget spent)"); failed=1; return 1
  fi
  echo "== $name (limit ${limit}s): $*" | tee -a "$log"
  start=$(date +%s)
  timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  summary+=("$name: exit $rc$( ((rc == 124)) && echo ' (timed out)') in $(( $(date +%s) - start ))s")
  (( rc != 0 )) && failed=1
  return $rc
}

# The modules lmcost needs besides torch; install the carried wheels only if one is missing.
need='import torch, numpy, pandas, yaml, rich, typer, sympy, humanize, pydantic'
if ! "$PYTHON" -c "$need" 2>/dev/null; then
  if compgen -G ".wheels/*.whl" >/dev/null; then
    site="$tmp/site"
    stage wheels 60 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .wheels/*.whl
    export PYTHONPATH="$PYTHONPATH:$site"
  fi
  if ! "$PYTHON" -c "$need" >>"$log" 2>&1; then
    echo "lmcost's dependencies are missing for $PYTHON and .wheels/ does not provide them: see this script's header" | tee -a "$log"
    exit 2
  fi
fi

stage env 60 "$PYTHON" - "$device" "$model" "$dtype" "$out/env.txt" <<'PY'
import platform, subprocess, sys, torch
device, model, dtype, path = sys.argv[1:]
lines = [f"python {sys.version.split()[0]} ({sys.executable}); {platform.platform()}",
         f"torch {torch.__version__}; CUDA {torch.version.cuda}; cuDNN {torch.backends.cudnn.version()}"]
try:
    import triton
    lines.append(f"triton {triton.__version__}")
except Exception as e:  # noqa: BLE001
    lines.append(f"triton: not importable ({type(e).__name__})")
if device.startswith("cuda") and torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    lines.append(f"GPU {p.name}: capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                 f"{p.total_memory / 2**30:.1f} GiB")
try:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    lines.append(f"lmcost {rev or 'not a git checkout'}{' with local changes' if dirty else ''}")
except OSError:
    lines.append("lmcost: git not found")
from lmcost import load_config
from lmcost.profiling.decoder import build_decoder
from lmcost.profiling.torch_dtypes import TORCH_DTYPES
cfg = load_config(model)
dec = build_decoder(cfg.model_copy(update=dict(n_layers=1)), max_batch=1, max_context=8,
                    dtype=TORCH_DTYPES[dtype], device=device)
lines.append(f"SDPA backend of the {model} decoder ({dtype}, {device}): {dec.sdpa_backend}")
for args in (["nvidia-smi"], ["nvidia-smi", "--query-gpu=name,driver_version,pstate,clocks.sm,clocks.max.sm,"
             "clocks.mem,power.limit,memory.total,temperature.gpu", "--format=csv"]):
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=20)
        lines += ["", "$ " + " ".join(args), r.stdout.rstrip()]
    except (OSError, subprocess.TimeoutExpired) as e:
        lines += ["", "$ " + " ".join(args), f"not run: {e}"]
open(path, "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:6]))
PY

shipped=$("$PYTHON" - "$device" <<'PY' 2>>"$log"
import sys, torch
name = torch.cuda.get_device_name() if sys.argv[1].startswith("cuda") and torch.cuda.is_available() else ""
print(next((g for key, g in (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100"), ("A100-SXM4-40GB", "a100-40gb"),
                              ("A100", "a100")) if key in name), ""))
PY
)
echo "device: $device; shipped YAML for it: ${shipped:-none}" | tee -a "$log"

yaml="$out/calibrated.yaml"
# fp32 is always measured
stage calibrate 150 "$PYTHON" -m lmcost calibrate --device "$device" --dtypes "$dtype" $quick -o "$yaml" || rm -f "$yaml"
gpu=$([ -f "$yaml" ] && echo "$yaml" || echo "$shipped")

rep="$tmp/reports"
mkdir -p "$rep"
if [ -n "$gpu" ]; then
  stage validate 180 "$PYTHON" -m lmcost validate "$model" --device "$device" --dtype "$dtype" --layers 2 --batch "$batch" \
    --prompt "$prompt" --gen 8 --repeats 5 --gpu "$gpu" --report-dir "$rep"
  cp "$rep"/validate-*.md "$out"/ 2>/dev/null
  # One file for the per-operator CSVs of every batch (the device tool brings back 8 files at most).
  "$PYTHON" - "$out/validate-ops.csv" "$rep"/validate-ops-*.csv <<'PY' >>"$log" 2>&1
import sys, pathlib, pandas as pd
files = [f for f in sys.argv[2:] if pathlib.Path(f).exists()]
if files:
    pd.concat([pd.read_csv(f).assign(file=pathlib.Path(f).name) for f in files]).to_csv(sys.argv[1], index=False)
PY
else
  summary+=("validate: skipped (no calibrated YAML and no shipped one for this device)"); failed=1
fi

[ -f "$yaml" ] && stage op-accuracy-calibrated 75 "$PYTHON" benchmarks/op_accuracy.py --gpu "$yaml" --device "$device" \
  --dtype "$dtype" --out "$out/op-accuracy-calibrated.md"
[ -n "$shipped" ] && stage "op-accuracy-$shipped" 75 "$PYTHON" benchmarks/op_accuracy.py --gpu "$shipped" --device "$device" \
  --dtype "$dtype" --out "$out/op-accuracy-$shipped.md"

printf '%s\n' "== stages" "${summary[@]}" | tee -a "$log"
ls -l "$out"
exit $failed
