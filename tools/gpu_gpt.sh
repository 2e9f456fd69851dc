#!/bin/bash
# The GPT example on the GPU: cold compile (tp and torch.compile, fresh processes), then the
# training / inference benchmark on the filled tp cache.  Usage (the device tool, repository root):
#   bash tools/gpu_gpt.sh [N_LAYER] [extra training.py flags...]
# Writes logs and JSON under $OUT (or /tmp/gpu_out).
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
NL=${1:-4}; shift
timeout ${COLD_TIMEOUT:-300} python3 benchmarks/compile_cold.py --device cuda --n-layer "$NL" --keep-tp-cache /tmp/tp_gpt$NL \
  --timeout $(( ${COLD_TIMEOUT:-300} / 2 - 5 )) --json "$OUT/compile_cold_$NL.json" 2>&1 | tail -40 | tee "$OUT/compile_cold_$NL.txt"
TP_CACHE_DIR=/tmp/tp_gpt$NL timeout ${TRAIN_TIMEOUT:-240} python3 benchmarks/training.py --device cuda --n-layer "$NL" \
  --repeats ${REPEATS:-7} --json "$OUT/training_$NL.json" "$@" 2>&1 | tail -40 | tee "$OUT/training_$NL.txt"
