#!/usr/bin/env bash
# GPU acceptance, one command on any CUDA or Apple-Silicon machine (and on a cpu, where the measured
# memory bandwidth stands in for the peak):
#
#   scripts/gpu-acceptance.sh [auto|cuda|cuda:N|mps|cpu]
#
# 1. the engine tests that run on the device (device placement, batched and speculative decoding, sampling);
# 2. the throughput-code and niah-smoke workloads with --device, each report gated by its preset's checks
#    (`kakeya gate check --preset`);
# 3. the decode benchmark (python -m benchmarks.decode_bandwidth): tok/s and the fraction of the device's memory
#    bandwidth reached, written to benchmarks/results/decode_bandwidth-<device>.json with the device name.
#
# Environment: PYTHON (default: python3), OUT (report folder, default: a temporary one), SKIP_TESTS=1 (skip
# step 1), QUICK=1 (tiny sizes, for the cpu test of this script). Exit status: the first step that failed.
set -euo pipefail

device="${1:-auto}"
case "$device" in
  auto | cpu | cuda | cuda:[0-9] | cuda:[0-9][0-9] | mps) ;;
  *) echo "gpu-acceptance: device must be auto, cpu, cuda, cuda:N or mps (got '$device')" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
out="${OUT:-$(mktemp -d -t kakeya-acceptance-XXXXXX)}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
kind="$("$python" -c "from engine.backends.torch.device import pick_device; print(pick_device('$device').type)")"
echo "gpu-acceptance: device $device ($kind), reports in $out"

if [ "${QUICK:-0}" = 1 ]; then
  tp=(--prompts 1 --new-tokens 8 --repeats 1 --batches 1,2 --min-speedup 0)  # plumbing, not speed: 8 tokens time nothing
  niah=(--contexts 128 --samples 1 --depths 0.1)
  bench=(--prompt-tokens 16 --new-tokens 8)
else
  tp=(--prompts 4 --new-tokens 96 --repeats 2 --batches 1,8,32)
  niah=(--contexts 256,512,1024 --samples 4)
  bench=()
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  "$python" -m pytest -q -p no:warnings tests/engine/test_batch.py -k "device" \
    tests/engine/test_speculative_batch.py tests/engine/test_sampling.py
fi

"$python" -m engine.workloads.throughput --model zoo:tiny-hybrid --drafter model:zoo:tiny-drafter --k 4 \
  --device "$device" --threads 0 --plot none "${tp[@]}" --out "$out/throughput-$kind.json"
"$python" -m bridge.cli gate check "$out/throughput-$kind.json" --preset throughput-code
"$python" -m engine.workloads.niah --model zoo:tiny-hybrid --policy hybrid:4:64,sink_window:4:64 \
  --device "$device" --threads 0 --plot none "${niah[@]}" --out "$out/niah-$kind.json"
"$python" -m bridge.cli gate check "$out/niah-$kind.json" --preset niah-smoke

"$python" -m benchmarks.decode_bandwidth --device "$device" "${bench[@]}" \
  --out "${BENCH_OUT:-benchmarks/results/decode_bandwidth-$kind.json}"
echo "gpu-acceptance: passed on $device ($kind)"
