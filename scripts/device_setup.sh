# Sourced by scripts/device_check.sh and scripts/device_learner.sh on the device machine: the carried wheels
# (`.whl`, from ../shared/gpu/prepare-wheels.sh) on PYTHONPATH, the project installed (editable, no deps), and the
# machine's facts in $OUT/$1 (printed too). Needs OUT set.
if [ -d .whl ]; then
  SITE=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || cat "$OUT/install.log"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null; \
  python3 -c "import jax; print(jax.__version__, jax.devices())"; } > "$OUT/$1" 2>&1
cat "$OUT/$1"
