import sys

from lrl_jax.cli import main

sys.exit(main())
