#!/usr/bin/env bash
# Issue 25's accelerator rows (the learner on a GPU), results under $OUT (default ./device_out). Run it after
# scripts/device_check.sh, on the same warm machine or a fresh one, with the same `.whl` carried:
#   run(command="OUT=$OUT bash scripts/device_learner.sh", carry=[".whl"], timeout_s=290)
# Sized to what the 15 minutes of device time leave after device_check.sh (~500 s) and a machine start: the limits
# below add up to 270 s.
# In order of what the issue needs most, each with its own time limit, each table written as it is made:
#   1. QAT's price: the bf16 step vs the INT4 / NVFP4 / FP8 QAT steps at an RL step's shapes (B x T, prompt P),
#      side by side, and the weight sync as a fraction of the step (target: QAT <= 1.10x bf16, sync <= 2%). With
#      remat full and logits in chunks of 256: the step without them does not fit a GPU at 64 x 1024 (its compiled
#      peak for the CPU backend is 233 GiB; with them 13.9 GiB);
#   2. the compiled step's peak memory on the GPU backend (baseline vs all techniques; target <= 38%), SmolLM2-135M
#      and Qwen2.5-7B shapes (compiled, not run);
#   3. the learner against transformers + torch on the same GPU (f32; TF32 matmuls on both sides), at TB x TT
#      (prompt TP), at torch's own work (the two "no sharing" rows): the learner's f32 rows run without remat and
#      chunks, 16 x 512 peaks at 29.5 GiB for the CPU backend (32 x 1024: 145 GiB).
# Shapes from the environment: B=64 T=1024 P=256, TB=16 TT=512 TP=128, R=3 (timed steps). A CPU smoke run:
#   B=16 T=72 P=48 TB=16 TT=72 TP=48 R=1 OUT=/tmp/dl bash scripts/device_learner.sh
set -u
OUT=${OUT:-device_out}; mkdir -p "$OUT"
B=${B:-64}; T=${T:-1024}; P=${P:-256}; TB=${TB:-16}; TT=${TT:-512}; TP=${TP:-128}; R=${R:-3}
source "$(dirname "$0")/device_setup.sh" machine_learner.txt
run() {  # run NAME LIMIT_S ARGS...: one benchmark, its table to $OUT/learner_NAME.md and to stdout
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m lrl_jax bench learner "$@" > "$OUT/learner_$name.md" 2>&1
  echo "bench learner $* exit $?" >> "$OUT/learner_$name.md"
  tail -12 "$OUT/learner_$name.md"
}
run qat 120 qat --batch "$B" --seq "$T" --prompt "$P" --repeats "$R" --remat full --logit-chunk 256
run memory 60 memory --models smollm2 qwen2.5-7b --batch "$B" --seq "$T" --prompt "$P" --only all
run torch 90 torch --torch-device cuda --batch "$TB" --seq "$TT" --prompt "$TP" --repeats "$R" --only "no sharing"
