#!/usr/bin/env bash
# Everything robust-pfl measures on a GPU, in stages that each fit a short lease of a
# GPU machine, every step under its own timeout, every result written under $OUT.
#
#   bash benchmarks/gpu_check.sh tests   # the cuda test suite, the quick start (about 4 min)
#   bash benchmarks/gpu_check.sh bench   # bench_steps --device cuda, targets first (about 6 min)
#   bash benchmarks/gpu_check.sh fig6    # reproduce fig6 --quick on MNIST (needs $ROBUST_PFL_DATA/mnist)
#   bash benchmarks/gpu_check.sh all     # the three in turn
#
# $OUT (default results/gpu_check) receives env.json, one <stage>.log per step, and
# status.txt with each step's exit code; a step killed by its timeout exits 124.
set -u
stages=${1:-all}
out=${OUT:-results/gpu_check}
mkdir -p "$out"

run_step() {  # run_step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "$name rc=$status seconds=$((SECONDS - start))" | tee -a "$out/status.txt"
}

python3 - >"$out/env.json" <<'EOF'
import json, platform, subprocess, torch
cuda = torch.cuda.is_available()
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({
    "commit": commit or "unknown (no git here)",
    "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
    "device": torch.cuda.get_device_name(0) if cuda else None,
    "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
}, indent=1))
EOF

case $stages in tests|all)
  run_step cuda_tests 300 python3 -m pytest -m cuda -q -rs -p no:cacheprovider tests/test_cuda.py
  run_step quickstart 120 python3 -m robust_pfl.cli run configs/quickstart.toml --device cuda --out "$out/quickstart" --overwrite
;; esac
case $stages in bench|all)
  run_step bench_steps 420 python3 benchmarks/bench_steps.py --device cuda --quick \
    --scales n250 n200 large n64 --time-limit 330 --out "$out/steps_cuda.json"
;; esac
case $stages in fig6|all)
  run_step fig6 660 python3 -m robust_pfl.cli reproduce fig6 --quick --device cuda \
    --data-dir "${ROBUST_PFL_DATA:-data}/mnist" --out "$out/fig6"
;; esac
