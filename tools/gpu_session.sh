#!/bin/bash
# One device session of the GPU backend: versions, the -m gpu tests, the benchmarks.
# Usage (the device tool, from the repository root):  bash tools/gpu_session.sh [tests|bench|all|quick|attention|host|gpt|gpt12]
# (host: the -m gpu tests, the host path's pieces, table 13 with 1 and 10 calls per reading;
#  gpt: matmul + epilogue and the GPT step in fp32 and bf16; gpt12: cold / warm compiles of the
#  12-layer GPT step in fresh processes, its bf16 step on the warm cache, the call overhead)
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
if [ "$WHAT" = gpt ]; then
  timeout 100 python3 benchmarks/matmul_epilogue.py --no-max-autotune 2>&1 | tail -40 | tee "$OUT/matmul_epilogue.txt"
  timeout 230 python3 benchmarks/training.py --device cuda --n-layer 4 --repeats 5 --json "$OUT/gpt_fp32.json" 2>&1 | tail -40 | tee "$OUT/gpt_fp32.txt"
  timeout 200 python3 benchmarks/training.py --device cuda --n-layer 4 --repeats 5 --dtype bf16 --no-inference --json "$OUT/gpt_bf16.json" 2>&1 | tail -40 | tee "$OUT/gpt_bf16.txt"
  exit 0
fi
if [ "$WHAT" = gpt12 ]; then
  timeout 330 python3 benchmarks/compile_cold.py --device cuda --dtype bf16 --timeout 150 --keep-tp-cache /tmp/tp12 \
    --json "$OUT/compile_cold.json" 2>&1 | tail -30 | tee "$OUT/compile_cold.txt"
  TP_CACHE_DIR=/tmp/tp12 timeout 170 python3 benchmarks/training.py --device cuda --dtype bf16 --repeats 5 --no-inference \
    --json "$OUT/gpt12_bf16.json" 2>&1 | tail -30 | tee "$OUT/gpt12_bf16.txt"
  timeout 80 python3 benchmarks/call_overhead.py --device cuda --number 5000 --repeats 9 2>&1 | tail -30 | tee "$OUT/call_overhead.txt"
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
if [ "$WHAT" = host ]; then
  timeout 60 python3 benchmarks/launch_latency.py --pieces 2>&1 | tail -40 | tee "$OUT/pieces.txt"
  timeout 80 python3 benchmarks/launch_latency.py --json "$OUT/latency.json" 2>&1 | tail -30 | tee "$OUT/latency.txt"
  timeout 150 python3 benchmarks/table13.py --device cuda --json "$OUT/table13.json" 2>&1 | tail -30 | tee "$OUT/table13.txt"
  timeout 150 python3 benchmarks/table13.py --device cuda --number 10 --json "$OUT/table13_n10.json" 2>&1 | tail -30 | tee "$OUT/table13_n10.txt"
  exit 0
fi
if [ "$WHAT" != tests ]; then
  timeout 100 python3 benchmarks/launch_latency.py --json "$OUT/latency.json" 2>&1 | tail -50 | tee "$OUT/latency.txt"
  timeout 200 python3 benchmarks/table13.py --device cuda --json "$OUT/table13.json" 2>&1 | tail -60 | tee "$OUT/table13.txt"
  timeout 120 python3 benchmarks/matmul_epilogue.py --no-max-autotune 2>&1 | tail -40 | tee "$OUT/matmul_epilogue.txt"
  [ "$WHAT" = quick ] || timeout 90 python3 benchmarks/call_overhead.py --device cuda 2>&1 | tail -30 | tee "$OUT/call_overhead.txt"
fi
