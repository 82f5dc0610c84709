"""The weight sync between a learner and a sampler on devices of its own: bytes moved and time, per served format.

lrl-jax bench sync [--model smollm2] [--learner 4] [--sampler 4] [--repeats 5]
  SmolLM2-135M shapes (random weights; `--model qwen2.5-7b` for the 7B shapes, eval_shape only: bytes, no timing).
  The learner's fp32 masters on a (data=1, fsdp=L) mesh of the first L devices; the sampler's (data=1, tensor=S)
  mesh on the next S (disaggregated) or on the same first S (colocated). Per format (bf16 = the weights cast, no
  quantization; INT4 g64, NVFP4, FP8 per channel): quantize on the learner's devices, then move the served tree
  (packed codes + scales) onto the sampler's shardings (`rl.sync(params, spec, mesh=...)`); bytes of one copy of
  the served tree, median seconds of each part over `repeats` round-robin rounds, and the ratios to bf16. One more
  INT4 row quantizes in the learner's own layout (`sync(align=False)`): what `align_for_quantize` saves.

Without an accelerator it simulates 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set here
when the backend has not started yet): a "transfer" is then a host memcpy plus the reshard, no interconnect, and
its time need not follow the bytes (measured: it does not; `lrl_jax/rl/README.md`); on GPUs / TPUs it is the real one.
"""

from __future__ import annotations

import argparse
import os
import sys

_FLAG = "--xla_force_host_platform_device_count"

__all__ = ["main"]


def main(argv=None) -> int:
  """`lrl-jax bench sync` (module docstring)."""
  ap = argparse.ArgumentParser(prog="lrl-jax bench sync", description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="smollm2", choices=["smollm2", "qwen2.5-7b"])
  ap.add_argument("--learner", type=int, default=4, help="the learner's devices (fsdp axis)")
  ap.add_argument("--sampler", type=int, default=4, help="the sampler's devices (tensor axis)")
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args(argv)
  if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    need = args.learner + args.sampler
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}={need}".strip()

  import jax  # noqa: PLC0415  (after XLA_FLAGS: the CPU backend reads it when it starts)
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from lrl_jax import learner as L  # noqa: PLC0415
  from lrl_jax import models, quant  # noqa: PLC0415
  from lrl_jax.rl.setup import make_sampler_mesh  # noqa: PLC0415
  from lrl_jax.rl.sync import SyncSpec, sync  # noqa: PLC0415

  n_l, n_s = args.learner, args.sampler
  devs = jax.devices()
  if n_l + n_s > len(devs):
    print(f"bench sync: --learner {n_l} + --sampler {n_s} devices; {len(devs)} are visible", file=sys.stderr)
    return 2
  mc = models.SMOLLM2_135M if args.model == "smollm2" else models.QWEN2_5_7B
  formats = {"bf16": None, "int4 g64": quant.Int4(group_size=64), "nvfp4": quant.NVFP4(), "fp8": quant.FP8()}
  specs = {
    n: SyncSpec(rules=None if s is None else quant.QuantRules.default(s), dtype=jnp.bfloat16)
    for n, s in formats.items()
  }
  # the same INT4 sync without `align_for_quantize`: what quantizing in the learner's layout costs where its K
  # shards split the groups (576 / fsdp rows: every fsdp but 1, 3, 9 for g64)
  unaligned = "int4 g64, learner layout"
  specs[unaligned] = specs["int4 g64"]
  sampler = {
    "disaggregated": make_sampler_mesh(devs[n_l : n_l + n_s], 1, n_s),
    "colocated": make_sampler_mesh(devs[:n_s], 1, n_s),
  }
  print(
    f"bench sync: {args.model} shapes, backend {jax.default_backend()}, learner fsdp={n_l} on devices 0-{n_l - 1}, "
    f"sampler tensor={n_s}; median of {args.repeats}, round-robin, compile excluded",
    flush=True,
  )
  if args.model != "smollm2":
    abstract = jax.eval_shape(lambda: models.init_params(mc, jax.random.key(0)))
    print("\n| served | bytes (one copy) | vs bf16 |\n|---|---|---|")
    sizes = {n: quant.tree_nbytes(jax.eval_shape(lambda p, s=s: sync(p, s), abstract)) for n, s in specs.items()}
    for n, b in sizes.items():
      print(f"| {n} | {b / 2**30:.2f} GiB | {b / sizes['bf16']:.3f}x |")
    return 0
  lmesh = L.make_mesh(fsdp=n_l, devices=devs[:n_l])
  params = models.init_params(mc, jax.random.key(0))
  params = jax.device_put(params, L.param_shardings(jax.eval_shape(lambda: params), lmesh))
  arms = [(n, place) for place in sampler for n in specs]
  times: dict = {a: {"quantize": [], "transfer": []} for a in arms}
  nbytes, landed = {}, {}  # one copy of the tree; what the sampler's devices hold (replicated leaves count S times)
  for rep in range(args.repeats + 1):  # round 0 compiles and warms up
    for name, place in arms:
      t: dict = {}
      served = sync(params, specs[name], mesh=sampler[place], timings=t, align=name != unaligned)
      nbytes[name] = t["sync_bytes"]
      landed[name] = sum(s.data.nbytes for x in jax.tree_util.tree_leaves(served) for s in x.addressable_shards)
      if rep:
        times[name, place]["quantize"].append(t["sync_quantize_s"])
        times[name, place]["transfer"].append(t["sync_transfer_s"])
  med = {a: {k: float(np.median(v)) for k, v in d.items()} for a, d in times.items()}
  print(
    "\n| placement | served | bytes (one copy) | vs bf16 | bytes on the sampler's devices | vs bf16 | quantize ms | "
    "transfer ms | transfer vs bf16 |\n|---|---|---|---|---|---|---|---|---|"
  )
  for name, place in arms:
    m, b = med[name, place], med["bf16", place]
    print(
      f"| {place} | {name} | {nbytes[name] / 2**20:.1f} MiB | {nbytes[name] / nbytes['bf16']:.3f}x | "
      f"{landed[name] / 2**20:.1f} MiB | {landed[name] / landed['bf16']:.3f}x | "
      f"{1e3 * m['quantize']:.1f} | {1e3 * m['transfer']:.1f} | {m['transfer'] / b['transfer']:.2f}x |",
      flush=True,
    )
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
