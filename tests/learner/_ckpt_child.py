"""Child process of the kill-during-save test: saves step 0, then starts saving step 1 and hangs
right before orbax commits it (all array files written, the temporary directory not yet renamed),
so that the parent can SIGKILL it mid-save."""

import asyncio
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from _learner_util import tiny_cfg  # noqa: E402
from orbax.checkpoint._src.path import atomicity  # noqa: E402

from lrl_jax import learner as L  # noqa: E402


def main(directory: str):
  cfg = L.LearnerConfig(lr=1e-3, compute_dtype="float32")
  state = L.create_train_state(jax.random.PRNGKey(0), tiny_cfg(), cfg)
  ck = L.Checkpointer(directory, save_every=1)
  ck.save(state)
  print("SAVED 0", flush=True)

  async def hang(self):  # the last moment of a save: data written, commit pending
    print("IN_SAVE", flush=True)
    while True:
      await asyncio.sleep(1)

  atomicity.AtomicRenameTemporaryPath.finalize = hang
  # Step 1's state differs from step 0's everywhere, so a half-written step 1 would be visible.
  state = state.replace(step=state.step + 1, params=jax.tree_util.tree_map(lambda x: x + 1.0, state.params))
  ck.save(state)
  print("UNREACHABLE", flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
