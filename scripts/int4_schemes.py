#!/usr/bin/env python
"""INT4 QAT schemes (issue 9): absmax vs minmax vs learned (LSQ) vs learned + zero point (LSQ+), the jolt of
switching QAT on with and without INT4-aware init, and SmolLM2-135M-Instruct numerics. Writes docs/int4_schemes.md
and docs/figures/int4_schemes.png.

  python scripts/int4_schemes.py --seeds 3                       # everything (about 30 min of one CPU core)
  python scripts/int4_schemes.py --parts rl --arms absmax,minmax  # some RL arms only (then --parts render)
  python scripts/int4_schemes.py --parts render                   # re-render from the saved results

Parts (each saves its numbers under --root, so parts can run separately and `--reuse` resumes):
  rl       the embedded task: GRPO with INT4 QAT, one arm per scheme / option, `--seeds` seeds, the settings of
           docs/results.md (configs/int4_qat_grpo.yaml + the overrides below); final greedy accuracy, reward
           smoothness, mean |π − μ| (learner QAT vs INT4 sampler).
  jolt     the embedded task's model: KL(π_float ‖ π_QAT) (`quant.policy_jolt`) on a fixed batch, at the random init
           and after a float warm-up (what a run with learner.qat_start_step > 0 meets when QAT switches on), each
           with the default and the INT4-aware init (learner.qat_init=grid).
  smollm2  SmolLM2-135M-Instruct (configs/smollm2_int4_qat_grpo.yaml): per-scheme weight error, the jolt on a batch
           of chat prompts, and mean |π − μ| on sampled rollouts served in INT4 (π with and without QAT).
  render   the Markdown report and the figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

CONFIG = "configs/int4_qat_grpo.yaml"
SMOL_CONFIG = "configs/smollm2_int4_qat_grpo.yaml"
# The settings of docs/results.md, so that the absmax arm reproduces its "INT4 rollouts + INT4 QAT" row.
COMMON = ["run.sft_batch=128", "run.batch_prompts=32", "learner.lr=5e-4", "learner.schedule=cosine"]
SCHEMES = {  # scheme name -> config overrides
  "absmax": [],
  "minmax": ["quant.int4_scheme=minmax"],
  "learned": ["quant.int4_scheme=learned"],
  "learned_zp": ["quant.int4_scheme=learned", "quant.int4_zero_point=true"],
}
ARMS: dict[str, tuple[list[str], str]] = {
  "absmax": (SCHEMES["absmax"], "absmax (amax/7, codes ±7; slime)"),
  "minmax": (SCHEMES["minmax"], "minmax (asymmetric, zero point)"),
  "learned": (SCHEMES["learned"], "learned scale (LSQ), codes [−8, 7]"),
  "learned_zp": (SCHEMES["learned_zp"], "learned scale + zero point (LSQ+)"),
  "absmax_grid": (["learner.qat_init=grid"], "absmax + INT4-aware init"),
  "absmax_clip": (["learner.int4_update_clip=1.0"], "absmax + update clip (k = 1)"),
  "absmax_late": (["learner.qat_start_step=10"], "absmax, QAT on at RL step 10 (float warm-up)"),
  "absmax_fade": (
    ["learner.qat_start_step=10", "learner.qat_warmup_steps=20"],
    "absmax, QAT faded in over RL steps 10–29 (float warm-up)",
  ),
}
CORE_ARMS = ["absmax", "minmax", "learned", "learned_zp"]


# --------------------------------------------------------------------------- rl


def run_rl(arms, seeds, *, root: Path, steps: int, sft_steps: int, reuse: bool):
  from lrl_jax.rl.experiments import run_arm

  out = {}
  for arm in arms:
    for seed in seeds:
      t0 = time.perf_counter()
      s = run_arm(
        "int4_qat",
        seed,
        root=root / "rl" / arm,
        steps=steps,
        sft_steps=sft_steps,
        eval_every=0,
        extra=COMMON + ARMS[arm][0],
        reuse=reuse,
      )
      print(
        f"rl {arm:12s} seed {seed}: accuracy {s.accuracy_before:.3f} -> {s.accuracy_after:.3f}, "
        f"|π−μ| {s.mismatch_mean:.3g}, smoothness {s.smoothness:.3g} ({time.perf_counter() - t0:.0f} s)",
        flush=True,
      )
      out[(arm, seed)] = s
  return out


def load_rl(root: Path):
  """(arm, seed) -> (summary dict, per-step train rewards) of every finished RL run under root."""
  from lrl_jax.rl.metrics import read_metrics

  runs = {}
  for arm in ARMS:
    for d in sorted((root / "rl" / arm / "int4_qat").glob("seed*")):
      f = d / "run_summary.json"
      if f.is_file():
        s = json.loads(f.read_text())
        rew = [r["reward_mean"] for r in read_metrics(d / "metrics.jsonl") if r.get("phase") == "rl"]
        runs[(arm, int(s["seed"]))] = (s, rew)
  return runs


# --------------------------------------------------------------------------- jolt (embedded task)


def _merge_siblings(trained, with_siblings):
  """`trained` (float params) plus the learned scale / zero leaves of `with_siblings` (a tree of dicts)."""
  out = dict(trained)
  for k, v in with_siblings.items():
    if isinstance(v, dict):
      out[k] = _merge_siblings(trained.get(k, {}), v)
    elif k not in trained:
      out[k] = v
  return out


def run_jolt(seeds, *, root: Path, sft_steps: int):
  """KL(π_float ‖ π_QAT) per scheme at init and after a float warm-up, default vs INT4-aware (grid) init."""
  import jax
  import jax.numpy as jnp

  from lrl_jax import models, quant
  from lrl_jax.config import load_config
  from lrl_jax.rl.setup import build_model
  from lrl_jax.rl.warmup import prepare_qat_params, supervised_warmup

  rows = []
  for seed in seeds:
    base = [f"run.seed={seed}", f"run.sft_steps={sft_steps}", *COMMON]
    cfg0 = load_config(CONFIG, base)
    setup = build_model(cfg0)
    sb = setup.task.supervised_batch(0, 128, split="eval")
    tokens, valid = jnp.asarray(sb.tokens), jnp.asarray(sb.valid)
    mcfg = setup.model_cfg
    fwd = jax.jit(
      lambda p, r: models.forward(p, tokens, mcfg, valid_BT=valid, numerics=models.Numerics(qat_rules=r))[0],
      static_argnums=1,
    )
    params0 = setup.params
    # A run with learner.qat_start_step > 0 warms up without QAT: the weights QAT meets when it switches on.
    # Float training ignores the learned s / z (zero gradient, no weight decay), so one float warm-up per init
    # serves every scheme with that init; the learned s / z are those initialised at step 0.
    late = lambda extra: load_config(CONFIG, base + ["learner.qat_start_step=1", *extra])
    warm = {"default": supervised_warmup(late([]), setup, params0, progress=False)}
    for grid_of in ("absmax", "minmax"):
      warm[f"grid_{grid_of}"] = supervised_warmup(
        late(SCHEMES[grid_of] + ["learner.qat_init=grid"]), setup, params0, progress=False
      )
    for scheme, ov in SCHEMES.items():
      for init in ("default", "grid"):
        extra = ov + (["learner.qat_init=grid"] if init == "grid" else [])
        cfg = load_config(CONFIG, base + extra)
        rules = cfg.learner.qat_rules
        p_init = prepare_qat_params(cfg, params0)
        kl0, m0 = quant.policy_jolt(fwd, p_init, rules, mask_BT=valid)
        grid_of = "minmax" if cfg.quant.learner_spec.asymmetric else "absmax"
        p_plain = warm["default" if init == "default" else f"grid_{grid_of}"]
        p_warm = _merge_siblings(p_plain, p_init)  # the learned s / z as initialised at step 0
        kl1, m1 = quant.policy_jolt(fwd, p_warm, rules, mask_BT=valid)
        kl2 = None
        if cfg.quant.learner_spec.learned:  # the alternative: learned s / z initialised when QAT switches on
          kl2 = float(quant.policy_jolt(fwd, quant.init_learned(p_plain, rules), rules, mask_BT=valid)[0])
        rows.append(
          {
            "seed": seed,
            "scheme": scheme,
            "init": init,
            "kl_init": float(kl0),
            "bound_init": float(m0["bound"]),
            "kl_warm": float(kl1),
            "bound_warm": float(m1["bound"]),
            "logit_diff_max_warm": float(m1["logit_diff_max"]),
            "kl_warm_reinit": kl2,
          }
        )
        print(
          f"jolt seed {seed} {scheme:10s} {init:7s}: at init {float(kl0):.3e}, after {sft_steps} float "
          f"warm-up steps {float(kl1):.3e}",
          flush=True,
        )
  (root / "jolt.json").write_text(json.dumps({"sft_steps": sft_steps, "rows": rows}, indent=1))
  return rows


# --------------------------------------------------------------------------- SmolLM2


def run_smollm2(*, root: Path, prompts: int, completions: int, seed: int = 0):
  """Per-scheme weight error, jolt and |π − μ| for SmolLM2-135M-Instruct (bf16 compute, INT4 g64)."""
  import jax
  import jax.numpy as jnp

  from lrl_jax import learner as L
  from lrl_jax import losses, models, quant
  from lrl_jax.config import load_config
  from lrl_jax.rl.loop import encode_prompt_batch
  from lrl_jax.rl.setup import build_model
  from lrl_jax.rl.sync import sync
  from lrl_jax.rl.warmup import prepare_qat_params
  from lrl_jax.sampler import generate

  t0 = time.perf_counter()
  cfg0 = load_config(SMOL_CONFIG, [f"run.seed={seed}"])
  setup = build_model(cfg0)
  print(f"smollm2: loaded in {time.perf_counter() - t0:.0f} s", flush=True)
  params = setup.params
  mcfg = setup.model_cfg  # dtype = learner compute dtype (bf16)
  prompts_, _ = setup.task.prompts(0, prompts, split="eval")
  tok, val = encode_prompt_batch(setup.task, prompts_)
  tokens, valid = jnp.asarray(tok), jnp.asarray(val)
  fwd = jax.jit(
    lambda p, r: models.forward(p, tokens, mcfg, valid_BT=valid, numerics=models.Numerics(qat_rules=r))[0],
    static_argnums=1,
  )
  out = {"prompts": prompts, "completions": completions, "schemes": {}}
  served_kernels = {}
  for scheme, ov in SCHEMES.items():
    t1 = time.perf_counter()
    cfg = load_config(SMOL_CONFIG, [f"run.seed={seed}", *ov])
    lcfg = cfg.learner
    rules = lcfg.qat_rules
    p = prepare_qat_params(cfg, params)
    # weight error of the array the matmul sees (the bf16 cast), over every quantized kernel
    flat = {quant.path_str(kp): x for kp, x in jax.tree_util.tree_leaves_with_path(p)}
    se = ss = 0.0
    deq = {}
    for path, w in flat.items():
      spec = rules.spec_for(path)
      if spec is None or path.endswith(("_scale", "_zero")):
        continue
      x = w.astype(jnp.bfloat16)
      q = quant.quantize(x, spec, axis=rules.axis, scale=flat.get(path + "_scale"), zero_point=flat.get(path + "_zero"))
      xh = quant.dequantize(q, jnp.float32)
      deq[path] = np.asarray(xh)
      se += float(jnp.sum((xh - x.astype(jnp.float32)) ** 2))
      ss += float(jnp.sum(x.astype(jnp.float32) ** 2))
    served_kernels[scheme] = deq
    kl, m = quant.policy_jolt(fwd, p, rules, mask_BT=valid)
    res = {
      "weight_rel_rmse": math.sqrt(se / ss),
      "jolt": float(kl),
      "jolt_bound": float(m["bound"]),
      "jolt_max": float(m["kl_max"]),
    }
    init_of = {"learned": "absmax", "learned_zp": "minmax"}.get(scheme)
    if init_of is not None and init_of in served_kernels:  # step-0 learned weights vs those of their init scheme
      res["init_scheme"] = init_of
      res["frac_weights_equal_init_scheme"] = float(
        sum(np.sum(deq[k] == served_kernels[init_of][k]) for k in deq) / sum(deq[k].size for k in deq)
      )
    # sample with the INT4 served weights (this scheme's sync); π with and without QAT on those tokens
    served = sync(p, cfg)
    enc = setup.task.encoder
    sampling = cfg.sampler.sampling(eos_id=enc.eos_id, pad_id=enc.pad_id, evaluation=False)
    roll = generate(
      served,
      jnp.asarray(tok),
      jnp.asarray(val),
      setup.sampler_cfg,
      sampling,
      jax.random.PRNGKey(seed),
      group_size=completions,
      cache_dtype=setup.sampler_cfg.dtype,
    )
    for name, lc in (("qat", lcfg), ("no_qat", lcfg.without_qat())):
      logp = L.token_logprobs(p, roll, setup.model_cfg, cfg=lc)
      mm = losses.finalize_metrics(losses.mismatch_metrics(logp, roll.sampler_logp, roll.loss_mask))
      res[f"mismatch_{name}"] = float(mm["prob_abs_diff_mean"])
      res[f"kl_k3_{name}"] = float(mm["kl_k3"])
    res["tokens"] = int(np.asarray(roll.loss_mask).sum())
    res["wall_s"] = time.perf_counter() - t1
    out["schemes"][scheme] = res
    print(f"smollm2 {scheme}: {res}", flush=True)
  (root / "smollm2.json").write_text(json.dumps(out, indent=1))
  return out


# --------------------------------------------------------------------------- report


def _ms(v, fmt="{:.3f}", scale=1.0):
  v = np.asarray([x for x in v if x is not None and math.isfinite(x)], np.float64) * scale
  if v.size == 0:
    return "n/a"
  return fmt.format(v.mean()) if v.size == 1 else f"{fmt.format(v.mean())} ± {fmt.format(v.std(ddof=1))}"


def render(root: Path, *, command: str, fig_path: Path, steps: int, sft_steps: int) -> str:
  runs = load_rl(root)
  jolt = json.loads((root / "jolt.json").read_text()) if (root / "jolt.json").is_file() else None
  smol = json.loads((root / "smollm2.json").read_text()) if (root / "smollm2.json").is_file() else None
  date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  L = [
    "# INT4 QAT schemes: absmax, minmax, learned (LSQ / LSQ+); INT4-aware init; update clipping",
    "",
    f"Rendered by `{command}` on {date}, {platform.machine()} CPU, 2 cores shared with other jobs (wall times "
    f"are indicative only), from the run directories under `{root}`. All of it is reproduced by one command, "
    f"`python scripts/int4_schemes.py --seeds 3 --arms {','.join(ARMS)}` (about 45 min of one core here); "
    "here the parts ran separately (`--parts smollm2`, `--parts rl --reuse` with the core arms, then the "
    "other arms, `--parts jolt`, `--parts render`).",
    "",
    "Schemes (`quant.int4_scheme`, `quant.int4_zero_point`; formulas in `lrl_jax/quant/specs.py`): **absmax** "
    "s = bf16(amax/7), codes ±7 (slime's recipe); **minmax** s = bf16((max − min)/15) with 0 in the range, "
    "a zero point per group, codes [−8, 7]; **learned** s trained by LSQ (Esser et al. 2020), initialised "
    "from absmax, codes [−8, 7]; **learned + zero point** s and z trained by LSQ / LSQ+ (Bhalgat et al. 2020), "
    "initialised from minmax. The sampler always serves the learner's s, z and codes (the contract tests of "
    "issue 9), so |π − μ| is compute order only.",
    "",
  ]
  # ---- RL
  if runs:
    arms = [a for a in ARMS if any(k[0] == a for k in runs)]
    seeds = sorted({k[1] for k in runs})
    L += [
      "## Embedded task: GRPO with INT4 QAT, per scheme",
      "",
      f"configs/int4_qat_grpo.yaml (tiny Qwen2-shaped model, D=64, L=2, INT4 g32) with `{' '.join(COMMON)}`: "
      f"the settings of docs/results.md; {sft_steps} supervised warm-up steps (in the arm's learner numerics, "
      f"except the late-QAT arms, whose warm-up is float), then {steps} GRPO steps; seeds {seeds}. Accuracy: "
      "greedy, 128 eval problems, generated by the sampler on its INT4 weights. Smoothness: std of the "
      "step-to-step change of the mean train reward (lower = smoother). |π − μ|: token-mean absolute "
      "difference of learner and sampler probabilities of the sampled tokens, mean over steps. "
      "Mean ± sample std over seeds.",
      "",
      "| arm | overrides | accuracy before RL (%) | final accuracy (%) | RL gain (points) | smoothness | "
      "mean abs(π − μ) | train reward first→last 5 |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for a in arms:
      rs = [runs[k][0] for k in sorted(runs) if k[0] == a]
      ov = " ".join(ARMS[a][0]) or "(none)"
      L.append(
        f"| {ARMS[a][1]} | `{ov}` | {_ms([r['accuracy_before'] for r in rs], '{:.1f}', 100)} | "
        f"{_ms([r['accuracy_after'] for r in rs], '{:.1f}', 100)} | "
        f"{_ms([r['accuracy_after'] - r['accuracy_before'] for r in rs], '{:.1f}', 100)} | "
        f"{_ms([r['smoothness'] for r in rs])} | {_ms([r['mismatch_mean'] for r in rs], '{:.2e}')} | "
        f"{_ms([r['reward_first'] for r in rs], '{:.2f}')} → {_ms([r['reward_last'] for r in rs], '{:.2f}')} |"
      )
    L += [
      "",
      "Per run:",
      "",
      "| arm | seed | before (%) | after (%) | smoothness | mean abs(π − μ) | wall (s) |",
      "|---|---|---|---|---|---|---|",
    ]
    for k in sorted(runs, key=lambda k: (list(ARMS).index(k[0]), k[1])):
      r = runs[k][0]
      L.append(
        f"| {k[0]} | {k[1]} | {100 * r['accuracy_before']:.1f} | {100 * r['accuracy_after']:.1f} | "
        f"{r['smoothness']:.3f} | {r['mismatch_mean']:.2e} | {r['wall_s']:.0f} |"
      )
    L += [""]
  # ---- jolt
  if jolt:
    rows = jolt["rows"]
    L += [
      "## The jolt of switching QAT on, with and without INT4-aware init (embedded task's model)",
      "",
      "KL(π_float ‖ π_QAT) of the next-token distribution, token-mean over the 128 eval sequences (prompt + "
      "answer, every valid position), `quant.policy_jolt`, learner numerics (f32). *At init*: the random "
      f"initial weights (std 0.02), i.e. QAT on from step 0. *After a float warm-up*: {jolt['sft_steps']} "
      "supervised steps without QAT (what a run with `learner.qat_start_step > 0` meets when QAT switches on; "
      "the learned s, z are those initialised at step 0). *grid* = `learner.qat_init=grid` "
      "(`quant.int4_aware_init` at step 0). Bound: the token-mean Hoeffding bound range(δ)²/8 of "
      "`quant.next_token_kl` (δ = QAT − float logits). Mean ± std over seeds.",
      "",
      "| scheme | init | jolt at init | bound | jolt after float warm-up | bound | learned s, z initialised "
      "at switch-on instead |",
      "|---|---|---|---|---|---|---|",
    ]
    for scheme in SCHEMES:
      for init in ("default", "grid"):
        rs = [r for r in rows if r["scheme"] == scheme and r["init"] == init]
        if rs:
          L.append(
            f"| {scheme} | {init} | {_ms([r['kl_init'] for r in rs], '{:.2e}')} | "
            f"{_ms([r['bound_init'] for r in rs], '{:.2e}')} | {_ms([r['kl_warm'] for r in rs], '{:.2e}')} | "
            f"{_ms([r['bound_warm'] for r in rs], '{:.2e}')} | "
            f"{_ms([r.get('kl_warm_reinit') for r in rs], '{:.2e}')} |"
          )
    L += [""]
  # ---- SmolLM2
  if smol:
    sc = smol["schemes"]
    L += [
      "## SmolLM2-135M-Instruct",
      "",
      "configs/smollm2_int4_qat_grpo.yaml: the Q4_1 GGUF dequantized to f32 masters, bf16 compute, INT4 g64 "
      "on every attention / MLP projection. Weight error: ‖ŵ − w‖/‖w‖ over all quantized kernels (w = the "
      f"bf16 cast the matmul sees). Jolt: KL(π_float ‖ π_QAT), token-mean over every position of "
      f"{smol['prompts']} chat prompts (eval split). |π − μ|: {smol['prompts']} prompts × "
      f"{smol['completions']} completions sampled (T = 1, 32 new tokens) from the INT4 served weights; π by the "
      "learner with QAT (the contract) and without (a float learner facing an INT4 sampler). Learned schemes "
      "at step 0: their initial s, z. A short GRPO run per scheme (a few steps, what this CPU allows) is in "
      "`int4_schemes_smollm2_rl.md` (`scripts/int4_schemes_smollm2_rl.py`).",
      "",
      "| scheme | weight rel. error | jolt KL | jolt bound | abs(π − μ), QAT learner | "
      "abs(π − μ), float learner | KL(μ‖π) k3, QAT / float | tokens |",
      "|---|---|---|---|---|---|---|---|",
    ]
    for s, r in sc.items():
      L.append(
        f"| {s} | {r['weight_rel_rmse']:.4f} | {r['jolt']:.3e} | {r['jolt_bound']:.2e} | "
        f"{r['mismatch_qat']:.2e} | {r['mismatch_no_qat']:.2e} | {r['kl_k3_qat']:.1e} / {r['kl_k3_no_qat']:.1e} | "
        f"{r['tokens']} |"
      )
    eq = [(s, r) for s, r in sc.items() if "frac_weights_equal_init_scheme" in r]
    if eq:
      L += [
        "",
        "Learned schemes at step 0 vs the scheme they are initialised from (fraction of quantized weights "
        "equal): "
        + "; ".join(f"{s} vs {r['init_scheme']}: {100 * r['frac_weights_equal_init_scheme']:.2f}%" for s, r in eq)
        + ".",
      ]
    L += [""]
  L += ["## What the numbers say", ""] + _findings(runs, jolt, smol) + [""]
  if runs:
    _figure(runs, jolt, fig_path)
    L += [f"![reward curves and jolt]({Path('figures') / fig_path.name})", ""]
  return "\n".join(L) + "\n"


def _arm_stats(runs, arm, key):
  v = np.asarray([runs[k][0][key] for k in runs if k[0] == arm], np.float64)
  v = v[np.isfinite(v)]
  return (float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan"), v.size) if v.size else None


def _findings(runs, jolt, smol) -> list[str]:
  """Comparisons computed from the numbers (no claim is written by hand)."""
  out = []
  base = _arm_stats(runs, "absmax", "accuracy_after") if runs else None
  if base:
    for a in ARMS:
      if a == "absmax" or not any(k[0] == a for k in runs):
        continue
      acc = _arm_stats(runs, a, "accuracy_after")
      gain = _arm_stats(runs, a, "accuracy_after")[0] - _arm_stats(runs, a, "accuracy_before")[0]
      bgain = base[0] - _arm_stats(runs, "absmax", "accuracy_before")[0]
      m = lambda arm, key: (_arm_stats(runs, arm, key) or (float("nan"),))[0]
      spread = max(x for x in (base[1], acc[1], 0.0) if math.isfinite(x))
      d = acc[0] - base[0]
      verdict = (
        "within the seed-to-seed spread (no evidence either way)"
        if abs(d) <= spread
        else ("better" if d > 0 else "worse") + " than absmax by more than the spread"
      )
      out.append(
        f"- **{a}** vs absmax: final accuracy {100 * acc[0]:.1f}% vs {100 * base[0]:.1f}% "
        f"({100 * d:+.1f} points, seed std up to {100 * spread:.1f}: {verdict}); RL gain "
        f"{100 * gain:+.1f} vs {100 * bgain:+.1f} points; smoothness {m(a, 'smoothness'):.3f} vs "
        f"{m('absmax', 'smoothness'):.3f}; mean abs(π − μ) {m(a, 'mismatch_mean'):.2e} vs "
        f"{m('absmax', 'mismatch_mean'):.2e}."
      )
  if jolt:
    rows = jolt["rows"]
    g0 = [r["kl_init"] for r in rows if r["init"] == "grid"]
    d0 = [r["kl_init"] for r in rows if r["init"] == "default"]
    if g0:
      out.append(
        f"- INT4-aware init removes the step-0 jolt exactly: KL = {max(g0):.1e} (max over schemes and "
        f"seeds) with `qat_init=grid`, vs {min(d0):.1e}–{max(d0):.1e} with the default init."
      )
    for scheme in SCHEMES:
      gw = [r["kl_warm"] for r in rows if r["scheme"] == scheme and r["init"] == "grid"]
      dw = [r["kl_warm"] for r in rows if r["scheme"] == scheme and r["init"] == "default"]
      if gw and dw:
        sd = max(np.std(gw, ddof=1), np.std(dw, ddof=1)) if len(gw) > 1 else 0.0
        d = np.mean(gw) - np.mean(dw)
        how = (
          "within the seed-to-seed spread: the grid init does not help once float training has moved the "
          "weights off the grid"
          if abs(d) <= sd
          else ("lower" if d < 0 else "higher") + " with the grid init"
        )
        out.append(
          f"- {scheme}, QAT switched on after {jolt['sft_steps']} float warm-up steps: jolt "
          f"{np.mean(gw):.2e} with the grid init vs {np.mean(dw):.2e} without (seed std up to {sd:.1e}): "
          f"{how}."
        )
      ri = [
        r["kl_warm_reinit"]
        for r in rows
        if r["scheme"] == scheme and r["init"] == "default" and r.get("kl_warm_reinit") is not None
      ]
      if ri:
        out.append(
          f"- {scheme}: with the learned s, z kept from step 0 through a float warm-up the switch-on jolt "
          f"is {np.mean(dw):.2e}; initialising them from the weights at the switch-on step gives "
          f"{np.mean(ri):.2e} ({np.mean(dw) / max(np.mean(ri), 1e-30):.0f}x less). Stale learned scales "
          "are the dominant jolt of a late QAT start; the learner therefore re-initialises them at "
          "`learner.qat_start_step` (`learner.learned_qat_start`, called by `train_step` and, before that "
          "step's rollouts, by `rl`), so a late start meets the second number."
        )
  if smol:
    sc = smol["schemes"]
    if "absmax" in sc and "minmax" in sc:
      a, m = sc["absmax"], sc["minmax"]
      out.append(
        f"- SmolLM2: minmax's weight error is {100 * (1 - m['weight_rel_rmse'] / a['weight_rel_rmse']):.0f}% "
        f"below absmax's ({m['weight_rel_rmse']:.4f} vs {a['weight_rel_rmse']:.4f}) and its jolt "
        f"{m['jolt']:.3f} vs {a['jolt']:.3f} nats/token. Both jolts are large for a pretrained model: "
        "switching INT4 QAT on changes the policy itself, which no init can avoid for given weights "
        "(the grid init of a pretrained model is the same one-time quantization, moved to step 0)."
      )
    for s_, r in sc.items():
      if "mismatch_qat" in r:
        out.append(
          f"- SmolLM2 {s_}: abs(π − μ) {r['mismatch_qat']:.2e} with the QAT learner vs "
          f"{r['mismatch_no_qat']:.2e} with a float learner on the same INT4 rollouts "
          f"({r['mismatch_no_qat'] / max(r['mismatch_qat'], 1e-30):.0f}x)."
        )
    for s_, r in sc.items():
      f = r.get("frac_weights_equal_init_scheme")
      if f is not None and f < 1:
        out.append(
          f"- SmolLM2 {s_} at step 0 equals {r['init_scheme']} on {100 * f:.2f}% of the quantized weights, "
          "not 100%: `quant.init_learned` computes the initial s (z) from the f32 masters, while the bf16 "
          "learner quantizes their bf16 cast, whose absmax / minmax scale can differ by a bf16 ulp. "
          "Harmless (the sampler serves the same learned s, z), but initialising from the compute-dtype "
          "cast would make step 0 identical to the init scheme."
        )
  if runs and any(k[0] in ("absmax_late", "absmax_fade") for k in runs):
    out.append(
      "- The late-QAT arms warm up in float (`qat_start_step > 0`), so they start RL from a better model "
      "(the QAT warm-up from a random init is the fragile part of every other arm); compare their RL gain, "
      "not their final accuracy. Their mean abs(π − μ) counts the 10 float RL steps (float learner vs INT4 "
      "sampler, as without QAT), and during a fade the learner's w + α(ŵ − w) is neither the float nor the "
      "served weights, so the mismatch is larger while α < 1, and back to the QAT level after."
    )
  if runs:
    out.append(
      "- Smoothness is lowest for runs whose reward stays near 0 (a collapsed warm-up): compare it between "
      "runs of similar accuracy."
    )
    lo = min(runs[k][0]["accuracy_after"] for k in runs)
    out.append(
      f"- The embedded task is noisy at 3 seeds: single runs end as low as {100 * lo:.0f}% (a warm-up that "
      "never took off), so differences of a few points between arms are not resolved here."
    )
  return out or ["- (nothing measured yet)"]


def _figure(runs, jolt, path: Path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2 if jolt else 1, figsize=(12 if jolt else 7, 4), squeeze=False)
  ax = axes[0, 0]
  for a in ARMS:
    curves = [runs[k][1] for k in sorted(runs) if k[0] == a]
    if not curves:
      continue
    n = min(len(c) for c in curves)
    m = np.mean([c[:n] for c in curves], axis=0)
    w = 5
    sm = np.convolve(m, np.ones(w) / w, mode="valid") if n >= w else m
    ax.plot(np.arange(len(sm)) + (w - 1 if n >= w else 0), sm, label=a)
  ax.set_xlabel("RL step")
  ax.set_ylabel("train reward (seed mean, 5-step avg)")
  ax.set_title("Embedded task, GRPO + INT4 QAT")
  ax.legend(fontsize=8)
  if jolt:
    ax = axes[0, 1]
    rows = jolt["rows"]
    labels, vals = [], []
    for s in SCHEMES:
      for init in ("default", "grid"):
        for when in ("kl_init", "kl_warm"):
          v = [r[when] for r in rows if r["scheme"] == s and r["init"] == init]
          if v:
            labels.append(f"{s}/{init}/{'init' if when == 'kl_init' else 'warm'}")
            vals.append(max(float(np.mean(v)), 1e-12))
    ax.barh(np.arange(len(vals)), vals, log=True)
    ax.set_yticks(np.arange(len(vals)), labels, fontsize=7)
    ax.set_xlabel("KL(π_float ‖ π_QAT) (1e-12 = exactly 0)")
    ax.set_title("Jolt of switching QAT on")
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--parts", default="rl,jolt,smollm2,render")
  p.add_argument("--arms", default=",".join(CORE_ARMS), help=f"RL arms, a subset of {', '.join(ARMS)}")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--steps", type=int, default=80)
  p.add_argument("--sft-steps", type=int, default=500)
  p.add_argument("--jolt-sft-steps", type=int, default=500, help="float warm-up steps before the late jolt")
  p.add_argument("--smol-prompts", type=int, default=8)
  p.add_argument("--smol-completions", type=int, default=2)
  p.add_argument("--root", default="runs/int4_schemes")
  p.add_argument("--out", default="docs/int4_schemes.md")
  p.add_argument("--figure", default="docs/figures/int4_schemes.png")
  p.add_argument("--reuse", action="store_true", help="RL: reuse finished runs with the same settings")
  args = p.parse_args(argv)
  parts = [x.strip() for x in args.parts.split(",") if x.strip()]
  arms = [a.strip() for a in args.arms.split(",") if a.strip()]
  bad = [a for a in arms if a not in ARMS]
  if bad:
    p.error(f"unknown arm(s) {bad}; valid: {', '.join(ARMS)}")
  root = Path(args.root)
  root.mkdir(parents=True, exist_ok=True)
  seeds = list(range(args.seeds))
  if "rl" in parts:
    run_rl(arms, seeds, root=root, steps=args.steps, sft_steps=args.sft_steps, reuse=args.reuse)
  if "jolt" in parts:
    run_jolt(seeds, root=root, sft_steps=args.jolt_sft_steps)
  if "smollm2" in parts:
    run_smollm2(root=root, prompts=args.smol_prompts, completions=args.smol_completions)
  if "render" in parts:
    command = "python scripts/int4_schemes.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(root, command=command.strip(), fig_path=Path(args.figure), steps=args.steps, sft_steps=args.sft_steps)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")
    print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
