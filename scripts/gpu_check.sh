#!/usr/bin/env bash
# The CUDA checks and figures, on a machine with an NVIDIA GPU and a python3 that holds torch
# with CUDA and triton (plus the project's other runtime packages):
#   bash scripts/gpu_check.sh OUT_DIR
# 1. pytest -m cuda: the compiled triton kernels against the dense reference, the engine on CUDA
#    against transformers, the cache and speculation on and off (tests/engine/test_cuda.py);
# 2. bench_spec and bench_engine with --device cuda, and bench_cuda_step (the default model must
#    be in the cache folder already, or reachable: `radixcache pull`).
# Each stage has a time bound and its own log; the JSON results are copied into OUT_DIR.
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

stage() {  # stage NAME SECONDS CMD...: run CMD with a bound, its output in OUT_DIR/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    tail -n "${TAIL_LINES:-25}" "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
stage cuda_tests "${TESTS_S:-300}" $py -m pytest -q -p no:cacheprovider -m cuda \
    tests/engine/test_cuda.py -rf --timeout 240
stage bench_spec "${SPEC_S:-240}" $py -m benchmarks.bench_spec --device cuda \
    --workloads ${SPEC_WORKLOADS:-repeat edit chat gsp-small} --batches 1 8 --modes off cache \
    --out spec_cuda
stage bench_engine "${ENGINE_S:-150}" $py -m benchmarks.bench_engine --device cuda \
    --workloads gsp mt --out engine_cuda
stage bench_cuda_step "${STEP_S:-120}" $py -m benchmarks.bench_cuda_step --out cuda_step
for name in spec_cuda engine_cuda cuda_step; do
    cp "benchmarks/results/$name.json" "$out"/ 2>/dev/null
done
exit 0
