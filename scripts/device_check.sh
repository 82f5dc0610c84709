#!/usr/bin/env bash
# One device run for issue #3 (kernels) on a GPU (or TPU) machine: the compiled-kernel tests and the
# decode benchmark, results under $OUT (default ./device_out). Prepare the wheels here first:
#   bash ../shared/gpu/prepare-wheels.sh      # aqtp, gguf -> .whl/ (the device lacks them)
# then run this script there with `.whl` carried. It installs them and the project (editable, no deps),
# runs `pytest -m device` with LRL_JAX_REQUIRE_DEVICE=1 (no accelerator = failure, not a skip), and the
# benchmark at the #3 targets: 8192x8192 and 4096x14336, M = 1, 8, 16 (ratios to bf16 in one run). On an
# sm_90 GPU the benchmark times the Triton kernel ("pallas"), the Mosaic GPU kernel ("mosaic"), XLA and, for INT4
# and NVFP4, the nn.Linear-layout kernel ("linear", kernels/linear.py) side by side.
set -u
OUT=${OUT:-device_out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_setup.sh" machine.txt
LRL_JAX_REQUIRE_DEVICE=1 timeout 180 python3 -m pytest -q -p no:cacheprovider -m device tests/device \
  > "$OUT/device_tests.txt" 2>&1; echo "device tests exit $?" | tee -a "$OUT/device_tests.txt"
tail -5 "$OUT/device_tests.txt"
timeout 240 python3 -m lrl_jax.kernels.bench --shapes 8192x8192,4096x14336 --m 1,8,16 --iters 50 \
  > "$OUT/bench.md" 2>&1; echo "bench exit $?" >> "$OUT/bench.md"
cat "$OUT/bench.md"
# Tuning rows the AOT compile could not settle (kernels/README.md), each beside its own bf16 and XLA rows:
# Triton with deeper pipelining (more bytes in flight per SM at decode), and the linear kernel's split-K (default 4
# at 8192x8192) at 1 and 8.
for v in "stages4:--num-stages 4 --formats int4_g128,nvfp4" "lsplit1:--linear-split-k 1 --formats int4_g128,nvfp4" \
         "lsplit8:--linear-split-k 8 --formats int4_g128,nvfp4"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 45 python3 -m lrl_jax.kernels.bench --shapes 8192x8192 --m 1,16 --iters 50 $flags \
    > "$OUT/bench_$name.md" 2>&1; echo "bench $flags exit $?" >> "$OUT/bench_$name.md"
  tail -12 "$OUT/bench_$name.md"
done
