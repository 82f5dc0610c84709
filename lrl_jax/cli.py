"""The `lrl-jax` command.

Each subcommand imports what it runs when it runs (the function-level imports below): `lrl-jax --help` and
`lrl-jax numerics` do not pay for the RL stack (orbax, the learner, the sampler), nor the RL commands for the
kernel benchmark.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

__all__ = ["main"]


def _numerics(args) -> int:
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from lrl_jax.quant import report  # noqa: PLC0415

  k, n = args.shape
  print(
    f"lrl_jax numerics demo: every format on a {k}x{n} N(0,1) weight matrix "
    f"(backend: {jax.default_backend()}, {jax.device_count()} device(s))",
    flush=True,
  )
  w = np.random.default_rng(args.seed).standard_normal((k, n)).astype(np.float32)
  rows = report.error_table(w, repeats=args.repeats)
  print(report.format_table(rows, f"quantize along K (axis 0), {k}x{n}, seed {args.seed}"))
  if not all(r.contract_holds for r in rows):
    print("contract violated: fake_quant != dequantize(quantize) for some format", file=sys.stderr)
    return 1
  print("\nfake_quant(w) == dequantize(quantize(w)) held bit for bit for every format.")
  return 0


def _bench(args, rest) -> int:
  if args.what == "sampler":
    from lrl_jax.sampler import bench as sampler_bench  # noqa: PLC0415

    return sampler_bench.engine_bench(rest) or 0
  if args.what == "learner":
    from lrl_jax.learner import bench as learner_bench  # noqa: PLC0415  (per-command imports)

    return learner_bench.main(rest) or 0
  if args.what == "sync":
    from lrl_jax.rl import bench as sync_bench  # noqa: PLC0415

    return sync_bench.main(rest) or 0
  if args.what != "kernels":
    raise SystemExit(f"lrl-jax bench: unknown target {args.what!r}; valid: kernels, sampler, learner, sync")
  from lrl_jax.kernels import bench  # noqa: PLC0415

  return bench.main(rest) or 0


_RL_COMMANDS = {"train": "train_main", "eval": "eval_main", "export": "export_main"}
QUICKSTART = Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml"


_COMMANDS = ("train", "eval", "export", "demo", "numerics", "bench")


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv and not argv[0].startswith("-") and argv[0] not in _COMMANDS:
    near = difflib.get_close_matches(argv[0], _COMMANDS, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    print(f"lrl-jax: unknown command {argv[0]!r}{hint}; commands: {', '.join(_COMMANDS)}", file=sys.stderr)
    return 2
  if argv and argv[0] == "demo":  # the README's main job: the embedded quickstart RL run
    if any(a in ("-h", "--help") for a in argv[1:]):
      print(
        "usage: lrl-jax demo [section.key=value ...]\n\nThe README's main job: `lrl-jax train "
        f"{QUICKSTART} --overwrite` (a tiny model learns 2-digit addition: warm-up, then GRPO with INT4 QAT and INT4 "
        "rollouts; minutes on 2 CPU cores; it replaces runs/quickstart). Overrides as for train. Example: `lrl-jax "
        "demo run.steps=50`; every train option: `lrl-jax train --help`."
      )
      return 0
    argv = ["train", str(QUICKSTART), "--overwrite", *argv[1:]]  # a demo replaces its previous run
  if argv and argv[0] in _RL_COMMANDS:  # `lrl-jax train configs/x.yaml [key=value ...]` and friends
    from lrl_jax.rl import cli as rl_cli  # noqa: PLC0415

    return getattr(rl_cli, _RL_COMMANDS[argv[0]])(argv[1:]) or 0
  parser = argparse.ArgumentParser(
    prog="lrl-jax",
    description="Low-precision RL for LLMs in JAX.",
    epilog="RL commands: lrl-jax train CONFIG [key=value ...] [--resume] | eval ... | export ... (each has --help)",
  )
  sub = parser.add_subparsers(dest="command", required=True)
  # train / eval / export are dispatched above (their own parsers, `lrl-jax train --help`); listed here for --help.
  sub.add_parser("train", help="run an RL job: `lrl-jax train configs/x.yaml [key=value ...] [--resume|--overwrite]`")
  sub.add_parser("eval", help="evaluate a run's checkpoint: `lrl-jax eval configs/x.yaml [--run DIR] [--size N]`")
  sub.add_parser("export", help="export a run's weights: `lrl-jax export --format int4|nvfp4|hf RUN OUT_DIR`")
  sub.add_parser("demo", help="the README's main job: `lrl-jax train configs/quickstart.yaml --overwrite`")
  p = sub.add_parser(
    "numerics",
    help="error table of every quantization format",
    description="Quantize one N(0,1) weight matrix in every format of the contract (INT4, FP8, MXFP8, NVFP4) and "
    "print each one's error and bits per weight; checks fake_quant == dequantize(quantize) bit for bit. Example: "
    "`lrl-jax numerics --shape 1024 1024`.",
  )
  p.add_argument(
    "--shape", type=int, nargs=2, default=(4096, 4096), metavar=("K", "N"), help="matrix shape (4096 4096)"
  )
  p.add_argument("--seed", type=int, default=0, help="the matrix's random seed")
  p.add_argument("--repeats", type=int, default=3, help="timing repeats per format (median)")
  p = sub.add_parser(
    "bench",
    help="benchmarks: `lrl-jax bench kernels [--quick ...]`, `lrl-jax bench sampler [...]`, "
    "`lrl-jax bench learner memory|qat|torch|aot|hostmem [...]`, `lrl-jax bench sync [...]`",
  )
  p.add_argument(
    "what",
    choices=["kernels", "sampler", "learner", "sync"],
    help="kernels: low-bit matmuls vs bf16 (`lrl-jax bench kernels --quick`); sampler: SmolLM2 rollouts, this "
    "sampler vs transformers, every format (`lrl-jax bench sampler --batches 16 64`); learner: memory / QAT cost / "
    "torch / a TPU target's AOT compile / glibc keeping freed host memory (`lrl-jax bench learner memory`); sync: "
    "the learner -> sampler weight transfer per format, disaggregated and colocated (`lrl-jax bench sync`). Each "
    "takes --help.",
  )
  args, rest = parser.parse_known_args(argv)
  if args.command == "numerics":
    if rest:
      parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _numerics(args)
  return _bench(args, rest)


if __name__ == "__main__":
  sys.exit(main())
