#!/bin/bash
# One device session of the GPU backend: versions, the -m gpu tests, the benchmarks.
# Usage (the device tool, from the repository root):  bash tools/gpu_session.sh [tests|bench|all|quick|attention]
# (quick: the -m gpu tests without the random programs, then the benchmarks; attention: the Triton
#  backend's and omni_attention's -m gpu tests, then experiment 6's script at the chapter's sizes)
# Writes logs and JSON under $OUT (or /tmp/gpu_out).
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TP_CACHE_DIR=/tmp/tp_cache
WHAT=${1:-all}
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/versions.txt"
if [ "$WHAT" = attention ]; then
  timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu test/nn/test_omni_attention.py test/stax/test_triton_gpu.py \
    --tb=short 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
  timeout 100 python3 examples/attention_variants.py --device cuda --repeats 3 2>&1 | tail -40 | tee "$OUT/experiment6.txt"
  exit 0
fi
if [ "$WHAT" != bench ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu test/stax/test_triton_gpu.py test/stax/test_cudagraphs.py \
    test/stax/test_triton_matmul.py test/profiler/test_profiler_gpu.py --tb=short 2>&1 | tail -80 | tee "$OUT/gpu_tests.txt"
fi
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  # random programs with their inputs on the GPU, compiled by Stax's Triton backend (strict_native)
  TP_RANDOM_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short \
    $(for k in 0 1 2 3; do echo "test/stax/test_random_programs.py::test_random_programs[$k]"; done) \
    2>&1 | tail -40 | tee "$OUT/random_programs_gpu.txt"
fi
if [ "$WHAT" != tests ]; then
  timeout 100 python3 benchmarks/launch_latency.py --json "$OUT/latency.json" 2>&1 | tail -50 | tee "$OUT/latency.txt"
  timeout 200 python3 benchmarks/table13.py --device cuda --json "$OUT/table13.json" 2>&1 | tail -60 | tee "$OUT/table13.txt"
  timeout 120 python3 benchmarks/matmul_epilogue.py --no-max-autotune 2>&1 | tail -40 | tee "$OUT/matmul_epilogue.txt"
  [ "$WHAT" = quick ] || timeout 90 python3 benchmarks/call_overhead.py --device cuda 2>&1 | tail -30 | tee "$OUT/call_overhead.txt"
fi
