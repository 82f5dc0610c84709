"""The learner step with the dense layers' dot as autodiff lays it out (before) and as `kernels.dense_dot` does (after).

    python scripts/dense_dot_ab.py [--share] [--dtype float32] [--remat none dots] [--qat int4|nvfp4] [--repeats 5]

The GRPO-sized step of `lrl-jax bench learner torch` (SmolLM2-135M shapes, random weights, 16 x 72 tokens, prompt
48 in groups of 8; forward, backward, AdamW). For each `--remat` policy it compiles the step twice in one process,
once with `kernels.dense_dot` replaced by the plain `lax.dot_general` (whose autodiff contracts the weight gradient
over two leading axes), once as it is, then times all the steps round-robin (`learner.bench._interleaved`) and
prints the medians, their ratio to the first row, and each step's loss and gradient norm (the forward is the same:
equal losses; the gradients within f32 rounding).
"""

from __future__ import annotations

import argparse
import importlib
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--share", action=argparse.BooleanOptionalAction, default=False, help="run a group's prompt once")
  ap.add_argument("--dtype", default="float32", help="the learner's compute dtype")
  ap.add_argument("--remat", nargs="+", default=["none"], help="learner.remat policies, one pair of rows each")
  ap.add_argument("--qat", choices=["int4", "nvfp4"], default=None, help="QAT format (INT4 g64 or NVFP4)")
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()

  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from jax import lax  # noqa: PLC0415

  from lrl_jax import kernels, models, quant  # noqa: PLC0415

  # the module (`lrl_jax.kernels.predecode` as an attribute is the function `predecode`): its `predecoded_dot`, the
  # dot of the hoisted QAT operands and of the bf16 cast of f32 kernels, calls the module's own `dense_dot`
  predecode = importlib.import_module("lrl_jax.kernels.predecode")
  from lrl_jax.learner import LearnerConfig, create_train_state, train_step  # noqa: PLC0415
  from lrl_jax.learner.bench import MODELS, _batch, _interleaved, _traced_with  # noqa: PLC0415

  mc = MODELS["smollm2"]
  roll = _batch(mc, 16, 72, 48, 8)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  qat = {None: None, "int4": quant.Int4(group_size=64), "nvfp4": quant.NVFP4()}[args.qat]

  def before(x, w, k_axis=0):
    return lax.dot_general(x, w, (((x.ndim - 1,), (k_axis,)), ((), ())), preferred_element_type=jnp.float32)

  def build(remat):
    cfg = LearnerConfig(lr=1e-6, compute_dtype=args.dtype, share_prompt=args.share, remat=remat, qat=qat)
    state = create_train_state(jax.random.PRNGKey(0), mc, cfg, params=params)
    return train_step.lower(state, roll, model_cfg=mc, cfg=cfg).compile(), state

  runs = {}
  for r in args.remat:
    with _traced_with("dense_dot", before, kernels, predecode):  # read when the step is traced
      runs[f"before, remat {r}"] = build(r)
    runs[f"after (dense_dot), remat {r}"] = build(r)
  metrics = {}
  med = _interleaved(runs, roll, args.repeats, first=metrics)
  first = next(iter(med.values()))
  print(
    f"SmolLM2-135M shapes, 16 x 72 tokens, prompt {'shared' if args.share else 'not shared'}, {args.dtype}, "
    f"QAT {args.qat or 'off'}; {os.cpu_count()} cores; median of {args.repeats}, round-robin\n"
  )
  print("| step | s | vs the first row | loss | grad norm |\n|---|---|---|---|---|")
  for k, t in med.items():
    print(
      f"| {k} | {t:.2f} | {t / first:.3f}x | {float(metrics[k]['loss']):.9g} | {float(metrics[k]['grad_norm']):.9g} |"
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
