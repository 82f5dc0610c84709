#!/usr/bin/env python
"""Runs the experiment arms of issue 6 and writes docs/results.md (see lrl_jax/rl/experiments.py).

python scripts/results.py --seeds 3 --steps 60
python scripts/results.py --seeds 1 --steps 2 --sft-steps 5 --out /tmp/results.md   # smoke run
"""

import sys

from lrl_jax.rl.experiments import main

if __name__ == "__main__":
  sys.exit(main())
