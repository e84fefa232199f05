#!/usr/bin/env bash
# The CUDA checks and figures, on a machine with an NVIDIA GPU and a python3 that holds torch
# with CUDA and triton (plus the project's other runtime packages):
#   bash scripts/gpu_check.sh OUT_DIR
# 1. pytest -m cuda: the compiled triton kernels (attention, fused row ops) against their
#    references, the engine on CUDA against transformers, the cache and speculation on and off,
#    decode steps replayed from CUDA graphs against eager ones (tokens, launches per step, graph
#    memory against the KV budget's reserve) (tests/engine/test_cuda.py);
# 2. bench_cuda_step (graphs on and off, host syncs per step), bench_tiers' device section
#    (host-tier spill and load GB/s, pinned), bench_engine and bench_spec with --device cuda (the
#    default model must be in the cache folder already, or reachable: `radixcache pull`).
# Each stage has a time bound and its own log, and all of them together stay within TOTAL_S
# (a stage gets what is left, and is skipped under 20 s); the JSON results are copied into
# OUT_DIR with stages.json (each stage's exit status and seconds).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
total=${TOTAL_S:-570}
stages=()

stage() {  # stage NAME SECONDS CMD...: run CMD with a bound, its output in OUT_DIR/NAME.log
    local name=$1 limit=$2
    shift 2
    local left=$((total - SECONDS))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        echo "== $name: skipped ($left s left of $total)"
        stages+=("\"$name\": {\"rc\": null, \"seconds\": 0}")
        return
    fi
    echo "== $name (at most $limit s)"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    stages+=("\"$name\": {\"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
    tail -n "${TAIL_LINES:-25}" "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
stage cuda_tests "${TESTS_S:-210}" $py -m pytest -q -p no:cacheprovider -m cuda \
    tests/engine/test_cuda.py -rf --timeout 180 --junitxml "$out/cuda_tests.xml" \
    -o junit_logging=system-out
stage bench_cuda_step "${STEP_S:-150}" $py -m benchmarks.bench_cuda_step --steps 16 \
    --graphs on off --run-ahead on off --out cuda_step
stage bench_tiers "${TIERS_S:-60}" $py -m benchmarks.bench_tiers --sections device --device cuda \
    --out tiers_cuda
stage bench_engine "${ENGINE_S:-120}" $py -m benchmarks.bench_engine --device cuda \
    --workloads gsp mt --out engine_cuda
stage bench_spec "${SPEC_S:-120}" $py -m benchmarks.bench_spec --device cuda \
    --workloads ${SPEC_WORKLOADS:-repeat edit chat gsp-small} --batches 1 8 --modes off cache \
    --out spec_cuda
for name in cuda_step engine_cuda tiers_cuda spec_cuda; do
    cp "benchmarks/results/$name.json" "$out"/ 2>/dev/null
done
(IFS=,; echo "{${stages[*]}}") >"$out/stages.json"
cat "$out/stages.json"
exit 0
