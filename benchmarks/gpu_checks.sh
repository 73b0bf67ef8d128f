#!/usr/bin/env bash
# The GPU checks of docs/guard.md, in one command for a lent GPU machine (its python3 holds torch with CUDA;
# rich-argparse travels as a wheel in .whl/, see the device notes in docs/guard.md):
#   tests/guard/test_nccl.py, benchmarks/guard_overhead.py --backend nccl --quick, benchmarks/gpu_step.py.
# Each part has its own time limit so that one stuck part leaves the others' figures. Logs go to $OUT
# (or ./gpu-checks). Usage: bash benchmarks/gpu_checks.sh [ROUNDS] [--diagnose]
set -u
out=${OUT:-gpu-checks}; mkdir -p "$out"
rounds=${1:-3}; diagnose=${2:-}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD/src
else
    export PYTHONPATH=$PWD/src
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'NCCL', torch.cuda.nccl.version())"
start=$SECONDS
timeout -s INT 200 python3 -m pytest tests/guard/test_nccl.py -q -p no:cacheprovider -rA --timeout 150 \
    2>&1 | tee "$out/nccl.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed"
echo "== test_nccl: $((SECONDS - start)) s"; start=$SECONDS
timeout 100 python3 benchmarks/guard_overhead.py --backend nccl --quick 2>&1 | tee "$out/overhead.log"
echo "== guard_overhead: $((SECONDS - start)) s"; start=$SECONDS
timeout 220 python3 benchmarks/gpu_step.py --rounds "$rounds" --steps 60 $diagnose 2>&1 | tee "$out/step.log"
echo "== gpu_step: $((SECONDS - start)) s"
