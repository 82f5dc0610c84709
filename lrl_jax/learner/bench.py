"""Learner benchmarks: what a step needs in memory, what QAT costs, and how fast it trains against a peer.

lrl-jax bench learner memory [--models smollm2 qwen2.5-7b] [--batch 64] [--seq 1024] [--prompt 256] [--dump DIR]
                             [--gpu h100 | h200]
  peak bytes of the compiled GRPO train step (`compiled.memory_analysis()`, ahead of time on this backend, or with
  `--gpu` for that GPU, which is not here: `kernels.gpu_aot`; nothing runs, nothing is allocated) and its matmul
  flops (`matmul_flops`, from the shapes), for the baseline (f32 Adam, no remat, logits whole) and each memory
  technique (8-bit Adam moments, remat policies, chunked logits), then all. `--dump DIR` (memory and aot): XLA's
  dumps of each compile under DIR/<row> (HLO, buffer assignment, live ranges; a TPU or GPU target's too) and each
  row's bytes live at the peak (`live_at_peak`).
lrl-jax bench learner qat [--batch 16] [--seq 72] [--repeats 3] [--micro-batches 1]
                          [--before [matmul | micro-batch | nvfp4]] [--remat none] [--logit-chunk N]
  SmolLM2-135M shapes (random weights): the bf16 learner step vs INT4 / NVFP4 / FP8 QAT steps, side by side in one
  process (median of `repeats`, timed round-robin, compile excluded), their ratio (`--before matmul`: also each step
  with its kernels fake-quantized at every matmul, as the learner did before it hoisted that out of the layer scan;
  `--before micro-batch`: with `--micro-batches M`, each step fake-quantizing once per micro-batch forward, as it did
  before it hoisted that out of the micro-batch loop; `--before nvfp4`: NVFP4's operand made through packed codes and
  XLA's f8 / f4 converts, as before `quant.nvfp4_operand`; each one's bf16 row is the same step again, a control for
  the noise); the AOT `cost_analysis()` bytes accessed ratio QAT / bf16 (the proxy where no accelerator runs it); the
  weight sync (`rl.sync`) as a fraction of the step.
lrl-jax bench learner aot [--tpu v5p:2x2x1 | --gpu h100 | h200] [--batch 16] [--seq 72] [--all-techniques] [--dump DIR]
  the bf16 and the INT4 / NVFP4 / FP8 QAT steps (SmolLM2-135M shapes) compiled for one chip of a TPU slice that is
  not here (libtpu, as `make test-aot` installs it; nothing runs): peak bytes (`memory_analysis()`) and, of the same
  step with its layer scan unrolled (`cost_analysis()` counts a loop body once), bytes accessed and flops. With
  `--gpu`: for that NVIDIA GPU (XLA:GPU, deviceless: jax's CUDA plugin, as `make test-aot` installs it), the bytes
  counted from the scan program's optimized HLO (`traffic.program_bytes`). The bytes-accessed ratio QAT / bf16 is
  the accelerator proxy of the QAT cost where no accelerator is lent.
lrl-jax bench learner hostmem [--batch 16] [--seq 72] [--repeats 10]
  glibc keeping the memory XLA frees (`lrl_jax.hostmem`, the default) vs returning it: two worker processes, one
  per setting (it must be set before XLA starts), each with the bf16 and the INT4 g64 QAT step and the INT4 sync of
  SmolLM2-135M shapes compiled; one round runs each once in one worker, then in the other, so a drift in the machine's
  speed reaches both. Medians, the ratio, and the page faults and system time per call.
lrl-jax bench learner torch [--batch 16] [--seq 72] [--repeats 3] [--only WORD ...] [--torch-device cpu | cuda]
  the same GRPO-sized step (SmolLM2-135M: forward, backward, AdamW) in this learner (f32 and bf16) vs
  transformers + torch f32 on the CPU (the `ref` extra; skipped without it; `--torch-device cuda`: on the GPU, beside
  the learner on JAX's GPU backend), tokens trained per second, and against the matmul bound: the step's matmul flops
  (`matmul_flops`) over the machine's measured dot rate in the row's compute dtype (f32 or bf16, f32 accumulation);
  and against that bound plus the time the step's other
  ops need to move their bytes (`traffic.program_bytes` of the compiled step) at the machine's measured bandwidth,
  an estimate rather than a bound (ops whose buffers stay in cache run faster than the stream). The torch row's
  "matmuls at the step's shapes" are its own work's products (no prompt sharing) through `torch.matmul`
  (`torch_matmul_time`): the learner's no-sharing row against it splits the ratio to torch into the two matmul
  libraries' speeds at the same products and the rest of each step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lrl_jax import models, quant
from lrl_jax.hostmem import released as _released
from lrl_jax.learner import traffic
from lrl_jax.learner.config import REMATS, LearnerConfig
from lrl_jax.learner.state import create_train_state
from lrl_jax.learner.step import train_step
from lrl_jax.models import decoder
from lrl_jax.rollout import Rollout

__all__ = ["MODELS", "abstract_rollout", "step_memory", "matmul_flops", "main"]

MODELS = {"smollm2": models.SMOLLM2_135M, "qwen2.5-7b": models.QWEN2_5_7B}

BASELINE = dict(opt_state_dtype="float32", remat="none", logit_chunk=None)
TECHNIQUES = {
  "baseline (f32 Adam, no remat, logits whole)": {},
  "8-bit Adam moments (fp8, blocks of 256)": dict(opt_state_dtype="fp8"),
  "remat: dots_no_batch": dict(remat="dots_no_batch"),
  "remat: full": dict(remat="full"),
  "logits in chunks of 256 positions": dict(logit_chunk=256),
  "all: fp8 moments + full remat + chunks": dict(opt_state_dtype="fp8", remat="full", logit_chunk=256),
}


def technique_config(label: str) -> LearnerConfig:
  """The benchmarks' learner config for one of TECHNIQUES: bf16 compute, the baseline with that technique's settings."""
  return LearnerConfig(lr=1e-6, compute_dtype="bfloat16", **{**BASELINE, **TECHNIQUES[label]})


def abstract_rollout(batch: int, seq: int, prompt: int, group: int) -> Rollout:
  """ShapeDtypeStructs of a GRPO rollout: `batch` completions in groups of `group`, `prompt` + completion slots."""
  s = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt)  # noqa: E731
  return Rollout(
    tokens=s((batch, seq), jnp.int32),
    loss_mask=s((batch, seq), jnp.bool_),
    sampler_logp=s((batch, seq), jnp.float32),
    valid=s((batch, seq), jnp.bool_),
    advantages=s((batch,), jnp.float32),
    group_size=group,
    prompt_len=prompt,
  )


def _placed(tree, sharding):
  """ShapeDtypeStructs of `tree`'s arrays, on `sharding` (None: as they are)."""
  if sharding is None:
    return tree
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def _compiled_step(model_cfg, cfg: LearnerConfig, rollout, sharding=None, dump: str | None = None):
  state = jax.eval_shape(lambda k: create_train_state(k, model_cfg, cfg), jax.ShapeDtypeStruct((2,), jnp.uint32))
  state, rollout = _placed(state, sharding), _placed(rollout, sharding)
  # per compile, not XLA_FLAGS: libtpu refuses --xla_dump_to in the environment but takes it here
  opts = {"xla_dump_to": dump, "xla_dump_hlo_as_text": True} if dump else None
  return train_step.lower(state, rollout, model_cfg=model_cfg, cfg=cfg).compile(compiler_options=opts)


def live_at_peak(dump: str) -> tuple[float, list[tuple[str, float]]]:
  """(bytes live at the peak, [(value, bytes)] largest first) of the newest train step XLA dumped into `dump`: the
  values its buffer assignment lists as "Live ranges at N (peak)" (`*train_step*-live-range.txt`), each byte of
  their buffers counted once (values that share a buffer, an in-place update and its operand, are listed apart:
  `*-buffer-assignment.txt`'s allocations and offsets), less the values in another memory space than the default (a
  TPU's VMEM and SMEM, allocations with a color), which `memory_analysis()` does not count. A listed value the
  assignment does not name (a loop body's parameter: its loop's own buffers, listed too) is not counted again. The
  compiled peak is at least this; what it has more is how the heap packs its buffers."""
  files = sorted(Path(dump).glob("*train_step*after_optimizations-live-range.txt"), key=lambda f: f.stat().st_mtime)
  if not files:
    raise FileNotFoundError(f"live_at_peak: no *train_step*after_optimizations-live-range.txt under {dump}")
  assignment = files[-1].with_name(files[-1].name.replace("-live-range.txt", "-buffer-assignment.txt"))
  if not assignment.exists():
    raise FileNotFoundError(f"live_at_peak: {files[-1]} has no buffer assignment beside it ({assignment.name})")
  where: dict[str, tuple[int, int, int] | None] = {}  # value -> (allocation, offset, size); None: not the default
  alloc, default = -1, True
  for line in assignment.read_text().splitlines():
    if m := re.match(r"allocation (\d+): ", line):
      alloc, default = int(m.group(1)), re.search(r", color [1-9]\d*,", line) is None
    elif m := re.match(r"\s+value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)", line):
      name = m.group(1) if m.group(1).endswith("}") else m.group(1) + "{}"
      where.setdefault(name, (alloc, int(m.group(3)), int(m.group(2))) if default else None)
  values, spans, inside = [], {}, False
  for line in files[-1].read_text().splitlines():
    if "(peak):" in line and line.strip().startswith("Live ranges at"):
      inside = True
    elif inside:
      m = re.match(r"\s+(\S+): (\d+) bytes \(cumulative", line)
      if not m:
        break
      place = where.get(m.group(1))
      if place is not None:
        values.append((m.group(1), float(m.group(2))))
        spans.setdefault(place[0], []).append((place[1], place[1] + place[2]))
  if not inside:
    raise ValueError(f"live_at_peak: {files[-1]} has no 'Live ranges at N (peak):' list")
  live = 0
  for iv in spans.values():  # the union of each allocation's live spans
    end = -1
    for b, e in sorted(iv):
      live += max(0, e - max(b, end))
      end = max(end, e)
  return float(live), sorted(values, key=lambda v: -v[1])


class _UnrolledLax:
  """`jax.lax` with `scan` unrolled whole. Put in place of the decoder's `lax` (`_traced_with("lax", ...)`), the layer
  scan becomes straight-line code, so that `cost_analysis()`, which counts a loop body once, counts every layer."""

  def __getattr__(self, name):
    return getattr(jax.lax, name)

  @staticmethod
  def scan(*args, **kwargs):
    return jax.lax.scan(*args, **{**kwargs, "unroll": True})


def step_memory(
  model_cfg,
  cfg: LearnerConfig,
  rollout,
  *,
  sharding=None,
  unroll: bool = False,
  dump: str | None = None,
  count_bytes: bool = False,
) -> dict[str, float]:
  """{"peak_bytes", "argument_bytes", "temp_bytes", "flops", "bytes_accessed"} of the compiled train step.

  peak = arguments + temporaries + outputs − aliased (the donated state is aliased with the new one).
  sharding: compile for its devices (a TPU chip that is not here: `kernels.tpu_aot.chip`, with libtpu; a GPU:
  `kernels.gpu_aot.chip`, with jax's CUDA plugin) instead of this backend's. unroll: the decoder's layer scan
  unrolled (its flops and bytes then count every layer; the memory is that program's, not the scan's). dump: a
  folder for XLA's dumps of the compile (HLO, buffer assignment, live ranges; `live_at_peak` reads them).
  count_bytes: also "program_bytes", the bytes one run moves counted from the optimized HLO, every loop body times
  its trip count (`traffic.program_bytes`; what a GPU target has in place of `cost_analysis()`, which is NaN there:
  flops and bytes_accessed)."""
  with _traced_with("lax", _UnrolledLax(), decoder) if unroll else contextlib.nullcontext():
    c = _compiled_step(model_cfg, cfg, rollout, sharding, dump)
  m = c.memory_analysis()
  cost = c.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  peak = m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  out = {
    "peak_bytes": float(peak),
    "argument_bytes": float(m.argument_size_in_bytes),
    "temp_bytes": float(m.temp_size_in_bytes),
    "flops": float(cost.get("flops", float("nan"))),
    "bytes_accessed": float(cost.get("bytes accessed", float("nan"))),
  }
  if count_bytes:
    out["program_bytes"] = float(sum(traffic.program_bytes(c.as_text())))
  return out


def matmul_flops(mc, batch: int, seq: int, prompt: int, group: int, *, share_prompt: bool = True, remat=None) -> float:
  """The matmul flops of one GRPO train step, counted from the shapes (forward, and backward = 2 x forward; full
  remat runs the trunk's forward once more). `cost_analysis()` cannot give this: it counts a loop body once, and the
  layers run in a `lax.scan`.

  Counted: the projections and the MLP of every trunk position (a group's prompt once when `share_prompt`), causal
  attention (4 · heads · head_dim flops per query-key pair, keys up to and including the query), and the LM head at
  the completion slots only (the learner computes no other logits)."""
  d, hd, H, KV = mc.hidden_size, mc.head_dim, mc.num_heads, mc.num_kv_heads
  per_token = 2 * (d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * mc.intermediate_size)  # one layer
  n = seq - prompt
  prompt_rows = batch // group if share_prompt else batch
  tokens = prompt_rows * prompt + batch * n
  pairs = prompt_rows * prompt * (prompt + 1) // 2 + batch * sum(t + 1 for t in range(prompt, seq))
  trunk = mc.num_layers * (per_token * tokens + 4 * H * hd * pairs)
  head = 2 * d * mc.vocab_size * batch * n
  forward = trunk + head
  return float(3 * forward + (trunk if remat == "full" else 0))


def _dump_dir(root: str | None, *names: str) -> str | None:
  """root/<names joined, as a file name> (created), or None without --dump."""
  if not root:
    return None
  path = Path(root) / "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", n).strip("_") for n in names)
  path.mkdir(parents=True, exist_ok=True)
  return str(path)


def _print_live(dump: str | None, m: dict) -> None:
  """With --dump: the bytes live at the compiled peak, the rest of the peak (the heap's packing), the largest."""
  if dump:
    live, values = live_at_peak(dump)
    top = ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in values[:4])
    print(
      f"  (dumped to {dump}: live at the peak {live / 2**30:.2f} GiB, packing {(m['peak_bytes'] - live) / 2**30:.2f}"
      f" GiB; largest: {top})",
      flush=True,
    )


def _gpu(name: str):
  """(sharding, GpuTarget) of a GPU that is not here (`kernels.gpu_aot`: jax's CUDA plugin, as `make test-aot`
  installs it)."""
  from lrl_jax.kernels import gpu_aot  # noqa: PLC0415  (describing a GPU needs jax's CUDA plugin)

  return gpu_aot.chip(name), gpu_aot.TARGETS[name]


def memory(args) -> int:
  sharding, card = _gpu(args.gpu) if args.gpu else (None, None)
  where = (
    f"one {card.name} ({card.memory_bytes / 2**30:.1f} GiB; XLA:GPU, deviceless)" if card else jax.default_backend()
  )
  print(
    f"GRPO train step, batch {args.batch} x {args.seq} tokens (prompt {args.prompt}, groups of {args.group}), bf16 "
    f"compute, compiled ahead of time for {where} (nothing runs); peak = arguments + temporaries "
    f"+ outputs - aliased",
    flush=True,
  )
  roll = abstract_rollout(args.batch, args.seq, args.prompt, args.group)
  fits = " vs the card's memory |" if card else ""
  print(
    "\n| model | technique | peak GiB | vs baseline | state (args) GiB | temporaries GiB | matmul TFLOP / step "
    f"(from the shapes) |{fits}"
  )
  print("|---|---|---|---|---|---|---|" + ("---|" if card else ""))
  for name in args.models:
    mc = MODELS[name]
    base = None
    for label, kw in TECHNIQUES.items():
      if args.only and kw and not any(w in label for w in args.only):
        continue
      cfg = technique_config(label)
      t0 = time.perf_counter()
      dump = _dump_dir(args.dump, name, label)
      m = step_memory(mc, cfg, roll, sharding=sharding, dump=dump)
      base = base or m["peak_bytes"]
      print(
        f"| {name} | {label} | {m['peak_bytes'] / 2**30:.2f} | {m['peak_bytes'] / base:.2f}x | "
        f"{m['argument_bytes'] / 2**30:.2f} | {m['temp_bytes'] / 2**30:.2f} | "
        f"{matmul_flops(mc, args.batch, args.seq, args.prompt, args.group, remat=cfg.remat) / 1e12:.1f} |"
        + (f" {m['peak_bytes'] / card.memory_bytes:.2f}x |" if card else ""),
        flush=True,
      )
      _print_live(dump, m)
      if args.verbose:
        print(f"  (compiled in {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
  return 0


# --------------------------------------------------------------------------- timed steps (random weights)


def _batch(mc, batch: int, seq: int, prompt: int, group: int, seed: int = 0) -> Rollout:
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, mc.vocab_size, (batch // group, seq))
  tokens = np.repeat(tokens, group, axis=0)
  tokens[:, prompt:] = rng.integers(0, mc.vocab_size, (batch, seq - prompt))
  mask = np.zeros((batch, seq), bool)
  mask[:, prompt:] = True
  return Rollout(
    tokens=jnp.asarray(tokens, jnp.int32),
    loss_mask=jnp.asarray(mask),
    sampler_logp=jnp.asarray(-rng.random((batch, seq)) * mask, jnp.float32),
    valid=jnp.ones((batch, seq), bool),
    advantages=jnp.asarray(rng.standard_normal(batch), jnp.float32),
    group_size=group,
    prompt_len=prompt,
  )


class _JaxRunner:
  """A callable that runs one train step (blocking until done) on its own state; compiled ahead of time and run once
  here. `compiled`: the program it runs (its HLO names are those a profile of it shows); `compile_s`: the compile."""

  def __init__(self, mc, cfg: LearnerConfig, roll: Rollout, params):
    self.state, self.roll = create_train_state(jax.random.PRNGKey(0), mc, cfg, params=params), roll
    t = time.perf_counter()
    self.compiled = train_step.lower(self.state, roll, model_cfg=mc, cfg=cfg).compile()
    self.compile_s = time.perf_counter() - t
    self()

  def __call__(self):
    with _released():  # its temporaries back in the heap before the next step asks for its own
      self.state, m = self.compiled(self.state, self.roll)
      jax.block_until_ready(m)


def _round_robin(steps: dict, repeats: int) -> dict[str, float]:
  """Median seconds of each callable in `steps`, timed one call of each per round so that a drift in the machine's
  speed reaches every row alike."""
  times = {k: [] for k in steps}
  for _ in range(repeats):
    for k, f in steps.items():
      t = time.perf_counter()
      f()
      times[k].append(time.perf_counter() - t)
  return {k: float(np.median(v)) for k, v in times.items()}


@contextlib.contextmanager
def _traced_with(name: str, value, *owners):
  """Traces with `owner.<name>` replaced by `value` in every module of `owners` (the learner as it was before a
  change, for before / after rows). jax's trace caches are cleared on the way in and out, so neither variant reuses
  the other's trace of the same arguments."""
  keep = [getattr(o, name) for o in owners]
  jax.clear_caches()
  for o in owners:
    setattr(o, name, value)
  try:
    yield
  finally:
    for o, k in zip(owners, keep, strict=True):
      setattr(o, name, k)
    jax.clear_caches()


def _per_matmul_operands():
  """The decoder with its layer kernels fake-quantized (or cast) at every matmul inside the layer scan (the learner
  before `decoder._hoist_operands`)."""
  return _traced_with("_hoist_operands", lambda params, specs, dtype: (params, specs), decoder)


def _per_forward_operands():
  """The learner with its QAT kernels fake-quantized once per micro-batch forward (the learner before
  `learner.step._hoist_once`)."""
  return _traced_with("hoist_qat_operands", lambda params, numerics, dtype: params, decoder)


@contextlib.contextmanager
def _nvfp4_by_casts():
  """The learner with its NVFP4 QAT operand made as before `quant.nvfp4_operand`: `quant.quantize` (codes packed to
  nibbles) then `dequantize`, its e4m3 block scales and e2m1 values rounded by XLA's f8 / f4 converts rather than
  by `qarray._round_e4m3` / `_round_e2m1` (the same numbers, bit for bit)."""

  def packed(x, spec=quant.NVFP4(), *, axis=-2):
    q = quant.quantize(x, spec, axis=axis)
    return quant.dequantize(q, jnp.float32, global_scale=False), q.global_scale

  qa = quant.qarray
  with contextlib.ExitStack() as stack:
    stack.enter_context(_traced_with("nvfp4_operand", packed, quant, qa))
    stack.enter_context(_traced_with("_round_e4m3", lambda v: v.astype(jnp.float8_e4m3fn).astype(jnp.float32), qa))
    stack.enter_context(_traced_with("_round_e2m1", lambda v: v.astype(jnp.float4_e2m1fn).astype(jnp.float32), qa))
    yield


def _interleaved(runs: dict, roll: Rollout, repeats: int, first: dict | None = None) -> dict[str, float]:
  """Median seconds per step of each compiled step in `runs` ({label: (compiled, state)}), timed round-robin (one
  step of each per round) so that a drift in the machine's speed reaches every row alike. `first`, if given, gets
  each label's metrics of its first (untimed) step."""
  times = {k: [] for k in runs}
  states = {}
  for k, (c, st) in runs.items():  # a first step each, untimed
    states[k], m = c(st, roll)
    jax.block_until_ready(m)
    if first is not None:
      first[k] = m
  for _ in range(repeats):
    for k, (c, _) in runs.items():
      t = time.perf_counter()
      states[k], m = c(states[k], roll)
      jax.block_until_ready(m)
      times[k].append(time.perf_counter() - t)
  return {k: float(np.median(v)) for k, v in times.items()}


QAT_FORMATS = {"int4 g64": quant.Int4(group_size=64), "nvfp4": quant.NVFP4(), "fp8": quant.FP8()}


def qat(args) -> int:
  from lrl_jax.rl.sync import SyncSpec, sync  # noqa: PLC0415  (rl builds on the learner)

  mc = MODELS["smollm2"]
  roll = _batch(mc, args.batch, args.seq, args.prompt, args.group)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  print(
    f"SmolLM2-135M shapes (random weights), GRPO step on {args.batch} x {args.seq} tokens (prompt {args.prompt}, "
    f"groups of {args.group}), bf16 compute, {args.micro_batches} micro-batch(es), remat {args.remat}, logits "
    f"{'whole' if args.logit_chunk is None else f'in chunks of {args.logit_chunk}'}, {jax.default_backend()}, "
    f"{os.cpu_count()} cores; median of {args.repeats}, steps timed round-robin, compile excluded",
    flush=True,
  )
  base_cfg = LearnerConfig(
    lr=1e-6,
    compute_dtype="bfloat16",
    micro_batches=args.micro_batches,
    remat=args.remat,
    logit_chunk=args.logit_chunk,
  )
  arms = {"bf16": base_cfg, **{f"{n} QAT": base_cfg.replace(qat=s) for n, s in QAT_FORMATS.items()}}
  runs, cost = {}, {}  # keyed by (arm, suffix)
  if args.before == "micro-batch" and args.micro_batches < 2:
    raise ValueError("--before micro-batch compares fake-quant per micro-batch: needs --micro-batches >= 2")
  before = {
    None: [],
    "matmul": [(_per_matmul_operands, " (per matmul, before)")],
    "micro-batch": [(_per_forward_operands, " (per micro-batch, before)")],
    "nvfp4": [(_nvfp4_by_casts, " (NVFP4 by packed codes and converts, before)")],
  }[args.before]
  for patch, suffix in [(contextlib.nullcontext, "")] + before:
    for name, cfg in arms.items():
      state = create_train_state(jax.random.PRNGKey(0), mc, cfg, params=params)
      with patch():
        c = train_step.lower(state, roll, model_cfg=mc, cfg=cfg).compile()
      ca = c.cost_analysis()
      cost[name, suffix] = float((ca[0] if isinstance(ca, (list, tuple)) else ca).get("bytes accessed", float("nan")))
      runs[name, suffix] = (c, state)
  t = _interleaved(runs, roll, args.repeats)
  syncs = {}
  for name, spec in QAT_FORMATS.items():
    spec_sync = SyncSpec(rules=quant.QuantRules.default(spec), dtype=jnp.bfloat16)
    jax.block_until_ready(sync(params, spec_sync))
    ts = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(sync(params, spec_sync))
      ts.append(time.perf_counter() - t0)
    syncs[f"{name} QAT"] = float(np.median(ts))
  print("\n| learner | step s | vs bf16 | AOT bytes accessed vs bf16 | sync s | sync / (step + sync) |")
  print("|---|---|---|---|---|---|")
  for arm, suffix in runs:
    key, base = (arm, suffix), ("bf16", suffix)
    sync_s = syncs.get(arm)
    sync_cols = "| |" if sync_s is None else f"| {sync_s:.2f} | {100 * sync_s / (t[key] + sync_s):.1f}% |"
    print(
      f"| {arm}{suffix} | {t[key]:.2f} | {t[key] / t[base]:.2f}x | {cost[key] / cost[base]:.2f}x {sync_cols}",
      flush=True,
    )
  return 0


def _hostmem_worker(args) -> int:
  """One side of `bench learner hostmem`: compiles its calls, then per line "run" on stdin runs each once and
  writes {call: [seconds, minor page faults, system seconds]} as one JSON line."""
  from lrl_jax import hostmem  # noqa: PLC0415
  from lrl_jax.rl.sync import SyncSpec, sync  # noqa: PLC0415

  mc = MODELS["smollm2"]
  roll = _batch(mc, args.batch, args.seq, args.prompt, args.group)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  base = LearnerConfig(lr=1e-6, compute_dtype="bfloat16")
  calls = {
    "bf16 step": _JaxRunner(mc, base, roll, params),
    "int4 g64 QAT step": _JaxRunner(mc, base.replace(qat=QAT_FORMATS["int4 g64"]), roll, params),
  }
  spec = SyncSpec(rules=quant.QuantRules.default(QAT_FORMATS["int4 g64"]), dtype=jnp.bfloat16)
  calls["int4 sync"] = lambda: jax.block_until_ready(sync(params, spec))
  calls["int4 sync"]()
  print(json.dumps({"state": hostmem.state()}), flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      break
    out = {}
    for k, f in calls.items():
      r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
      f()
      t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
      out[k] = [t1 - t0, r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime]
    print(json.dumps(out), flush=True)
  return 0


def hostmem(args) -> int:
  """`bench learner hostmem` (module docstring): the two workers, round-robin."""
  from lrl_jax.hostmem import ENV  # noqa: PLC0415

  cmd = [sys.executable, "-m", "lrl_jax.learner.bench", "hostmem", "--worker"]
  cmd += ["--batch", str(args.batch), "--seq", str(args.seq), "--prompt", str(args.prompt), "--group", str(args.group)]
  arms = {"kept (default)": "1", f"returned ({ENV}=0)": "0"}
  workers = {}
  for label, value in arms.items():  # one at a time: two compiles at once would time each other
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, ENV: value})
    line = p.stdout.readline()
    if not line:
      raise RuntimeError(f"bench learner hostmem: the worker with {ENV}={value} exited (rc {p.wait()}) before it ran")
    workers[label] = (p, json.loads(line)["state"])
  print(
    f"SmolLM2-135M shapes (random weights), GRPO step on {args.batch} x {args.seq} tokens (prompt {args.prompt}), "
    f"bf16 compute; {os.cpu_count()} cores; median of {args.repeats} rounds (one call of each per worker per round)",
    flush=True,
  )
  rows = {label: [] for label in workers}
  try:
    for _ in range(args.repeats):
      for label, (p, _) in workers.items():
        p.stdin.write("run\n")
        p.stdin.flush()
        line = p.stdout.readline()
        if not line:
          raise RuntimeError(f"bench learner hostmem: the {label} worker exited (rc {p.wait()})")
        rows[label].append(json.loads(line))
  finally:
    for p, _ in workers.values():
      p.stdin.close()
      p.wait()
  kept, returned = list(rows)
  print(
    f"\n| call | {kept} s | {returned} s | kept / returned | page faults kept / returned | system s kept / returned |"
  )
  print("|---|---|---|---|---|---|")
  for call in rows[kept][0]:
    med = {label: np.median([r[call] for r in rs], axis=0) for label, rs in rows.items()}
    a, b = med[kept], med[returned]
    print(
      f"| {call} | {a[0]:.3f} | {b[0]:.3f} | {a[0] / b[0]:.2f}x | {a[1]:.0f} / {b[1]:.0f} | {a[2]:.2f} / {b[2]:.2f} |"
    )
  print("workers: " + "; ".join(f"{label}: lrl_jax.hostmem.state() = {st!r}" for label, (_, st) in workers.items()))
  return 0


def aot(args) -> int:
  """The bf16 and QAT steps compiled for an accelerator that is not here (nothing runs). One chip of a TPU slice
  (`--tpu`): the scan program's peak, and the bytes accessed and flops of the same step with its layer scan unrolled
  (what `cost_analysis()` counts in full). One GPU (`--gpu`): the peak, and the bytes the scan program moves counted
  from its optimized HLO (`traffic.program_bytes`: loop bodies times their trip counts; XLA:GPU's deviceless
  executable has no `cost_analysis()`)."""
  mc = MODELS["smollm2"]
  if args.gpu:
    target, card = _gpu(args.gpu)
    where = f"one {card.name} (XLA:GPU, deviceless, kernels untuned; nothing runs); bytes the step's HLO moves"
  else:
    from lrl_jax.kernels.tpu_aot import chip as tpu_chip  # noqa: PLC0415  (describing a TPU needs libtpu)

    target = tpu_chip(args.tpu)
    where = (
      f"one chip of TPU {args.tpu} (XLA:TPU, nothing runs); bytes and flops of the layer-unrolled step's "
      "cost_analysis()"
    )
  roll = abstract_rollout(args.batch, args.seq, args.prompt, args.group)
  base = technique_config(
    "all: fp8 moments + full remat + chunks" if args.all_techniques else "baseline (f32 Adam, no remat, logits whole)"
  )
  arms = {"bf16": base, **{f"{n} QAT": base.replace(qat=s) for n, s in QAT_FORMATS.items()}}
  flops = matmul_flops(mc, args.batch, args.seq, args.prompt, args.group, remat=base.remat)
  print(
    f"SmolLM2-135M GRPO step, {args.batch} x {args.seq} tokens (prompt {args.prompt}, groups of {args.group}), bf16 "
    f"compute, {'all three memory techniques' if args.all_techniques else 'f32 Adam, no remat, logits whole'}; "
    f"compiled for {where}; matmul flops from the shapes {flops / 1e12:.3f} T",
    flush=True,
  )
  print("\n| learner | peak GiB | vs bf16 | bytes accessed GB | vs bf16 | flops T | vs the shapes' matmul flops |")
  print("|---|---|---|---|---|---|---|")
  rows = {}
  for name, cfg in arms.items():
    dump = _dump_dir(args.dump, args.gpu or args.tpu, name)
    m = step_memory(mc, cfg, roll, sharding=target, dump=dump, count_bytes=bool(args.gpu))
    if args.gpu:
      rows[name] = (m["peak_bytes"], m["program_bytes"])
      fl = "- | -"
    else:
      u = step_memory(mc, cfg, roll, sharding=target, unroll=True)
      rows[name] = (m["peak_bytes"], u["bytes_accessed"])
      fl = f"{u['flops'] / 1e12:.3f} | {u['flops'] / flops:.2f}x"
    peak, acc = rows[name]
    print(
      f"| {name} | {peak / 2**30:.2f} | {peak / rows['bf16'][0]:.2f}x | {acc / 1e9:.2f} | {acc / rows['bf16'][1]:.2f}x "
      f"| {fl} |",
      flush=True,
    )
    _print_live(dump, m)
  return 0


def _best_time(f, *args, repeats: int) -> float:
  """Seconds of the fastest of `repeats` calls of f(*args) (after one untimed call: the compile)."""
  jax.block_until_ready(f(*args))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    best = min(best, time.perf_counter() - t)
  return best


def _dot_rate(n: int = 2048, repeats: int = 5, dtype=jnp.float32) -> float:
  """This machine's measured matmul rate (flop/s) through XLA: an n x n x n dot of `dtype` operands accumulated in
  f32, best of `repeats`. (bf16 is the learner's bf16 compute: on a CPU with AMX it runs several times the f32 rate.)"""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  dot = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  return 2 * n**3 / _best_time(dot, a, a, repeats=repeats)


def _bandwidth(n: int = 1 << 26, repeats: int = 7) -> float:
  """This machine's measured memory bandwidth (bytes/s) through XLA: x * a + y on n f32 elements (256 MiB arrays
  by default, far past the caches), 3 n · 4 bytes read and written, best of `repeats`."""
  x = jnp.ones((n,), jnp.float32)
  return 3 * 4 * n / _best_time(jax.jit(lambda x, y: x * 1.5 + y), x, x + 1, repeats=repeats)


def step_matmuls(mc, batch: int, seq: int, prompt: int, group: int, *, share_prompt: bool = True) -> dict:
  """{(b, m, k, n): how many} of the [b, m, k] @ [b, k, n] products one train step (forward + backward, no remat)
  computes, as the grouped forward lays them out: the prompt once per group (`share_prompt`) then every row's
  completion slots attending to prompt + completion keys, the LM head at the completion slots. Attention products
  are counted whole (the causal mask hides half of them, it does not skip them). Backward: each product [m, k] @
  [k, n] has two, [m, n] @ [n, k] (the input's gradient) and [k, m] @ [m, n] (the weight's)."""
  d, hd, H, KV, inter = mc.hidden_size, mc.head_dim, mc.num_heads, mc.num_kv_heads, mc.intermediate_size
  n_gen = seq - prompt
  rows_p = batch // group if share_prompt else batch
  fwd: dict = {}

  def add(b, m, k, n, times=1):
    fwd[(b, m, k, n)] = fwd.get((b, m, k, n), 0) + times

  for m in (rows_p * prompt, batch * n_gen):  # the projections and the MLP of the prompt tokens, then the completions'
    for k, n in ((d, H * hd), (d, KV * hd), (d, KV * hd), (H * hd, d), (d, inter), (d, inter), (inter, d)):
      add(1, m, k, n, mc.num_layers)
  add(rows_p * H, prompt, hd, prompt, mc.num_layers)  # prompt scores, then their values
  add(rows_p * H, prompt, prompt, hd, mc.num_layers)
  add(batch * H, n_gen, hd, seq, mc.num_layers)  # completion queries over prompt + completion keys
  add(batch * H, n_gen, seq, hd, mc.num_layers)
  add(1, batch * n_gen, d, mc.vocab_size)  # the LM head
  out = dict(fwd)
  for (b, m, k, n), c in fwd.items():
    for shape in ((b, m, n, k), (b, k, m, n)):
      out[shape] = out.get(shape, 0) + c
  return out


def matmul_time(products: dict, dtype=jnp.float32, repeats: int = 5) -> float:
  """Seconds XLA takes for the products of `step_matmuls`, each shape timed alone (best of `repeats`) times its count:
  the step's matmul time at its own shapes, which small or skinny products make slower than one large square dot."""
  total = 0.0
  rng = np.random.default_rng(0)
  f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))  # as the learner's dots
  for (b, m, k, n), count in products.items():
    x = jnp.asarray(rng.standard_normal((b, m, k)), dtype)
    y = jnp.asarray(rng.standard_normal((b, k, n)), dtype)
    total += _best_time(f, x, y, repeats=repeats) * count
  return total


def torch_matmul_time(products: dict, device: str = "cpu", repeats: int = 5) -> float:
  """`matmul_time` through torch (f32 `torch.matmul`, TF32 where `_torch_runner` allows it): the same products at the
  same shapes in the peer's own matmul library (MKL / oneDNN on a CPU, cuBLAS on a GPU). Needs the `ref` extra."""
  import torch  # noqa: PLC0415

  sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
  g = torch.Generator().manual_seed(0)
  total = 0.0
  for (b, m, k, n), count in products.items():
    x = torch.randn(b, m, k, generator=g).to(device)
    y = torch.randn(b, k, n, generator=g).to(device)
    torch.matmul(x, y)
    sync()
    best = float("inf")
    for _ in range(repeats):
      t = time.perf_counter()
      torch.matmul(x, y)
      sync()
      best = min(best, time.perf_counter() - t)
    total += best * count
  return total


def _torch_runner(batch: int, seq: int, prompt: int, threads: int, device: str = "cpu"):
  """(a callable that runs one transformers + torch f32 step: forward, a masked token log-prob loss, backward, AdamW;
  run once here, label), or (None, why not). device "cuda": the model and batch on the GPU, TF32 matmuls allowed
  (what XLA's default precision does with f32 dots there), the callable waiting for the GPU."""
  try:
    import torch  # noqa: PLC0415  (the `ref` extra)
    import transformers  # noqa: PLC0415
  except ImportError as e:
    return None, f"skipped: {e} (pip install -e '.[ref]')"
  if device != "cpu" and not torch.cuda.is_available():
    return None, f"skipped: torch {torch.__version__} sees no {device} device"
  torch.set_num_threads(threads)
  if device != "cpu":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
  mc = MODELS["smollm2"]
  hf = transformers.LlamaConfig(
    vocab_size=mc.vocab_size,
    hidden_size=mc.hidden_size,
    intermediate_size=mc.intermediate_size,
    num_hidden_layers=mc.num_layers,
    num_attention_heads=mc.num_heads,
    num_key_value_heads=mc.num_kv_heads,
    head_dim=mc.head_dim,
    tie_word_embeddings=True,
    max_position_embeddings=mc.max_position_embeddings,
  )
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(hf).float().train().to(device)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
  g = torch.Generator().manual_seed(0)
  ids = torch.randint(0, mc.vocab_size, (batch, seq), generator=g).to(device)
  adv = torch.randn(batch, generator=g).to(device)

  def step():
    opt.zero_grad(set_to_none=True)
    n = seq - prompt
    logits = model(input_ids=ids, logits_to_keep=n + 1).logits[:, :-1].float()  # the completion slots' predictions
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt:, None])[..., 0]
    loss = -(logp * adv[:, None]).mean()
    loss.backward()
    opt.step()
    if device != "cpu":
      torch.cuda.synchronize()

  step()
  tf32 = "" if device == "cpu" else f" ({device}, TF32 matmuls)"
  return step, f"transformers {transformers.__version__} + torch {torch.__version__} f32{tf32}"


def torch_peer(args) -> int:
  mc = MODELS["smollm2"]
  threads = os.cpu_count() or 1
  roll = _batch(mc, args.batch, args.seq, args.prompt, args.group)
  params = models.init_params(mc.replace(param_dtype="float32"), jax.random.PRNGKey(0))
  n_tok = args.batch * args.seq
  print(
    f"SmolLM2-135M shapes (random weights), one GRPO-sized step (forward + backward + AdamW) on {args.batch} x "
    f"{args.seq} tokens (loss on the last {args.seq - args.prompt}), {threads} cores, JAX on {jax.default_backend()}, "
    f"torch on {args.torch_device}; median of {args.repeats}, one step of each row per round",
    flush=True,
  )
  rate, rate16, bw = _dot_rate(), _dot_rate(dtype=jnp.bfloat16), _bandwidth()
  rates = {jnp.dtype(jnp.float32): rate, jnp.dtype(jnp.bfloat16): rate16}  # each row's bound: its compute dtype's
  print(
    f"measured dot rate (2048^3, XLA, f32 accumulation): f32 {rate / 1e9:.1f}, bf16 {rate16 / 1e9:.1f} GFLOP/s; "
    f"memory bandwidth (x * a + y, 256 MiB, XLA): {bw / 1e9:.1f} GB/s",
    flush=True,
  )
  print(
    "\n| learner | step s | tokens / s | vs torch | matmul flops / step (from the shapes) | matmul bound s | vs bound "
    "| matmuls at the step's shapes s | vs those | other ops' GB / step (HLO) | matmul + traffic estimate s | vs that |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  torch_step, label = _torch_runner(args.batch, args.seq, args.prompt, threads, args.torch_device)
  arms = {
    "lrl_jax f32, prompt shared": LearnerConfig(lr=1e-6, compute_dtype="float32"),
    "lrl_jax f32, no sharing": LearnerConfig(lr=1e-6, compute_dtype="float32", share_prompt=False),
    # saving only the dots' outputs for the backward (the rest recomputed): fewer stacked residuals to write and read
    "lrl_jax f32, no sharing, remat dots": LearnerConfig(
      lr=1e-6, compute_dtype="float32", share_prompt=False, remat="dots"
    ),
    "lrl_jax f32, prompt shared, remat dots": LearnerConfig(lr=1e-6, compute_dtype="float32", remat="dots"),
    "lrl_jax bf16, prompt shared": LearnerConfig(lr=1e-6, compute_dtype="bfloat16"),
    # XLA:CPU rewrites a bf16 scan's stacked residuals whole each layer; straight-line layers write each once
    "lrl_jax bf16, prompt shared, layers unrolled": LearnerConfig(
      lr=1e-6, compute_dtype="bfloat16", unroll_layers=True
    ),
  }
  if args.only:  # a subset of the rows (each keeps its own state, params and Adam, for the whole run)
    arms = {k: v for k, v in arms.items() if any(w in k for w in args.only)}
  runners = {name: _JaxRunner(mc, cfg, roll, params) for name, cfg in arms.items()}
  steps = runners if torch_step is None else {"torch": torch_step, **runners}
  med = _round_robin(steps, args.repeats)  # torch and the three learners one step each per round
  t_torch = med.get("torch")
  rows = []
  for name, cfg in arms.items():
    flops = matmul_flops(mc, args.batch, args.seq, args.prompt, args.group, share_prompt=cfg.share_prompt)
    shapes = step_matmuls(mc, args.batch, args.seq, args.prompt, args.group, share_prompt=cfg.share_prompt)
    # the bytes of every op that is not a dot, as XLA compiled the step (the layer loop's ops times its trip count)
    _, other = traffic.program_bytes(runners[name].compiled.as_text())
    dt = jnp.dtype(cfg.compute_dtype)
    rows.append((name, med[name], flops, matmul_time(shapes, dt), other, rates[dt]))
  if t_torch is not None:
    # torch's own work: every row's tokens through the layers (no prompt sharing), in its own matmul library
    flops = matmul_flops(mc, args.batch, args.seq, args.prompt, args.group, share_prompt=False)
    shapes = step_matmuls(mc, args.batch, args.seq, args.prompt, args.group, share_prompt=False)
    t_mm = torch_matmul_time(shapes, args.torch_device)
    print(
      f"| {label} | {t_torch:.2f} | {n_tok / t_torch:.0f} | 1.00x | {flops / 1e12:.2f} T | {flops / rate:.2f} "
      f"| {t_torch * rate / flops:.2f}x | {t_mm:.2f} (torch.matmul) | {t_torch / t_mm:.2f}x | | | |"
    )
  else:
    print(f"| transformers + torch | — | — | {label} | | | | | | | | |")
  for name, t, flops, at_shapes, other, row_rate in rows:
    vs = f"{t_torch / t:.2f}x" if t_torch else ""
    bound = flops / row_rate
    both = bound + other / bw
    print(
      f"| {name} | {t:.2f} | {n_tok / t:.0f} | {vs} | {flops / 1e12:.2f} T | {bound:.2f} | {t / bound:.2f}x "
      f"| {at_shapes:.2f} | {t / at_shapes:.2f}x | {other / 1e9:.1f} | {both:.2f} | {t / both:.2f}x |"
    )
  return 0


def main(argv=None) -> int:
  """`lrl-jax bench learner memory | qat | torch | aot | hostmem [...]` (module docstring)."""
  ap = argparse.ArgumentParser(prog="lrl-jax bench learner", description=__doc__.split("\n\n")[0])
  ap.add_argument("what", choices=["memory", "qat", "torch", "aot", "hostmem"])
  ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  ap.add_argument("--batch", type=int, default=None, help="completions per step (memory: 64; qat / torch: 16)")
  ap.add_argument("--seq", type=int, default=None, help="tokens per completion row (memory: 1024; qat / torch: 72)")
  ap.add_argument("--prompt", type=int, default=None, help="prompt slots (memory: 256; qat / torch: 48)")
  ap.add_argument("--group", type=int, default=8, help="completions per prompt (the learner runs a prompt once)")
  ap.add_argument("--repeats", type=int, default=None, help="timed steps (hostmem: rounds; default 10, else 3)")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # hostmem's worker process
  ap.add_argument(
    "--before",
    nargs="?",
    const="matmul",
    choices=["matmul", "micro-batch", "nvfp4"],
    default=None,
    help="qat: also the steps with the kernels fake-quantized at every matmul (matmul, the default) or once per "
    "micro-batch forward (micro-batch, with --micro-batches), as the learner did before it hoisted each, or with "
    "NVFP4's operand made through packed codes and XLA's f8 / f4 converts (nvfp4), as before `quant.nvfp4_operand`",
  )
  ap.add_argument("--micro-batches", type=int, default=1, help="qat: learner.micro_batches of every step")
  ap.add_argument(
    "--remat",
    default="none",
    choices=REMATS,
    help="qat: learner.remat of every step (an RL step's shapes on an accelerator need one: 64 x 1024 unremat peaks "
    "at ~233 GiB)",
  )
  ap.add_argument(
    "--logit-chunk", type=int, default=None, help="qat: learner.logit_chunk of every step (default: logits whole)"
  )
  ap.add_argument(
    "--only",
    nargs="+",
    default=None,
    metavar="WORD",
    help="memory: only the techniques whose label contains one of these words (the baseline always runs); torch: "
    "only the learner rows whose label contains one",
  )
  ap.add_argument(
    "--torch-device",
    default="cpu",
    choices=["cpu", "cuda"],
    help="torch: where the torch peer runs (cuda: beside the learner on a GPU; the learner: JAX's default backend)",
  )
  ap.add_argument("--tpu", default="v5p:2x2x1", help="aot: the TPU slice to compile for (one chip of it)")
  ap.add_argument(
    "--gpu",
    default=None,
    choices=["h100", "h200"],
    help="aot / memory: compile for this NVIDIA GPU instead (XLA:GPU, deviceless: jax's CUDA plugin, as `make "
    "test-aot` installs it beside the venv)",
  )
  ap.add_argument(
    "--all-techniques", action="store_true", help="aot: fp8 moments, full remat and logit chunks (else the baseline)"
  )
  ap.add_argument(
    "--dump",
    default=None,
    metavar="DIR",
    help="memory / aot: XLA's dumps of each compiled step under DIR/<row> (HLO, buffer assignment, live ranges; on a "
    "TPU target too), and each row's bytes live at the peak",
  )
  ap.add_argument("--verbose", action="store_true")
  args = ap.parse_args(argv)
  big = args.what == "memory"
  args.batch = args.batch or (64 if big else 16)
  args.seq = args.seq or (1024 if big else 72)
  args.prompt = args.prompt or (256 if big else 48)
  args.repeats = args.repeats or (10 if args.what == "hostmem" else 3)
  if args.worker:
    return _hostmem_worker(args)
  return {"memory": memory, "qat": qat, "torch": torch_peer, "aot": aot, "hostmem": hostmem}[args.what](args)


if __name__ == "__main__":
  raise SystemExit(main())
