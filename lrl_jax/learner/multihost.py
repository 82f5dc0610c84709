"""Multi-host runs: one Python process per host, all running the same program (JAX multi-controller).

Launch recipe (GPU clusters or Cloud TPU pods):

1. Start the same program on every host: `lrl-jax train CONFIG` (the RL loop, `rl.procs`: every process samples
   its share of each batch, the learner is one program on the global mesh `learner.mesh` spanning every host's
   devices, process 0 writes the run directory, which must be on a file system all hosts see; or, with
   `run.placement: disaggregated` and the learner's mesh on one process's devices and `sampler.mesh` on the other's,
   `rl.roles`: one process learns and one samples, the served weights sent between them), or your script built
   on the learner (`create_train_state` / `train_step` on a global mesh, as tests/learner/_mp_child.py does), with

     LRL_JAX_COORDINATOR=<host0 ip>:<port>   # e.g. 10.0.0.2:8476, reachable from every host
     LRL_JAX_NUM_PROCESSES=<number of hosts>
     LRL_JAX_PROCESS_ID=<0 .. N-1>            # host 0 runs the coordinator service

   (or JAX's own JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID). Under SLURM,
   Open MPI, Kubernetes (JobSet) or on Cloud TPU, leave them unset: `jax.distributed.initialize()`
   detects the cluster and fills them in.
2. `initialize_distributed()` must run before anything touches a device (the first jnp op,
   `jax.devices()`). After it, `jax.devices()` lists every host's devices and
   `jax.local_devices()` this host's.
3. Build the global mesh with `make_mesh(data=..., fsdp=..., tensor=...)` over all devices
   (keep `tensor` inside one host: its collectives are the most frequent), create the state
   with `create_train_state(..., mesh=mesh)`, and feed each step a global batch: every host
   builds the rows of its own devices and assembles them with
   `jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim), local_rows)`.
4. Checkpoints: every process calls `Checkpointer.save` / `restore_latest` with the same
   directory on a shared file system (or a GCS bucket); orbax coordinates the hosts and
   process 0 commits the checkpoint.

Single process (the tests, a laptop): `initialize_distributed()` without any variable and
outside a cluster does nothing.
"""

from __future__ import annotations

import os

import jax

__all__ = ["initialize_distributed"]

_AUTO = ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES")


def initialize_distributed(
  *,
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  local_device_ids=None,
) -> bool:
  """Connects this process to the others (`jax.distributed.initialize`); returns whether it did.

  Arguments default to LRL_JAX_COORDINATOR, LRL_JAX_NUM_PROCESSES, LRL_JAX_PROCESS_ID. With none of
  them set, it calls `jax.distributed.initialize()` only where JAX can detect a cluster
  (JAX_COORDINATOR_ADDRESS, SLURM, Open MPI, Cloud TPU), and otherwise returns False (one process).

  Raises:
    ValueError: some but not all of coordinator / num_processes / process_id given, or a bad value.
  """
  env = os.environ
  coordinator_address = coordinator_address or env.get("LRL_JAX_COORDINATOR")
  if num_processes is None and env.get("LRL_JAX_NUM_PROCESSES"):
    num_processes = int(env["LRL_JAX_NUM_PROCESSES"])
  if process_id is None and env.get("LRL_JAX_PROCESS_ID"):
    process_id = int(env["LRL_JAX_PROCESS_ID"])
  given = [coordinator_address is not None, num_processes is not None, process_id is not None]
  if any(given) and not all(given):
    raise ValueError(
      "initialize_distributed: give coordinator_address, num_processes and process_id together "
      f"(got coordinator={coordinator_address!r}, num_processes={num_processes!r}, "
      f"process_id={process_id!r})"
    )
  if any(given) or any(k in env for k in _AUTO):
    # CPU devices of different processes reach each other through gloo (XLA:CPU's cross-process collectives);
    # the setting concerns only the CPU backend and must precede its start.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if all(given):
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(
        f"initialize_distributed: need 0 <= process_id < num_processes; got {process_id}, {num_processes}"
      )
    jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      local_device_ids=local_device_ids,
    )
    return True
  if any(k in env for k in _AUTO):
    jax.distributed.initialize(local_device_ids=local_device_ids)
    return True
  return False
