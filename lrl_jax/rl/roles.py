"""The learner and the sampler in processes of their own: a disaggregated run whose two meshes lie in two processes.

With `run.placement: disaggregated` across two processes whose devices hold one mesh each (e.g. 2 hosts, or 2
processes of one host, with `sampler.mesh` the size of one process's devices and `learner.mesh: [-1, 1, 1]`), `rl.train`
in each process takes the role its devices hold (`role_of`). Each role is the single-process code on its own devices
(`procs.solo`): the learner's process runs the warm-up, the learner's steps, the checkpoints and writes the run's
files; the sampler's process generates, scores and evaluates. They meet only through messages (`Link`), the learner
asking and the sampler answering:

  hello (the RL step to start at, the off-policy weights held at a resume)  -> ok
  eval  (+ the served weights when they changed)                         -> the evaluation record (+ problems)
  step k (+ the served weights of step k)                                 -> step k's rollouts, rewards, record
  stop  (the run's result, or the error that stopped the learner)

The served weights travel as they are served (packed low-bit codes and scales: `rl.sync`), quantized on the learner's
devices, once per step; the sampler places them on its mesh (`sampler.shard_params`). Synchronous: the sampler
generates step k on the weights of step k while the learner waits. `run.async_rollouts`: the sampler answers step k
with what its thread generated, then generates step k + 1 on the weights the queue's rule gives it (one step stale)
while the learner trains on step k; the learner keeps the same queue of the weights it sent, for its checkpoints. The
numbers are those of the same config in one process (the same devices do the same work).

The control messages go through the `jax.distributed` coordination service's key-value store, where a process may
wait for hours (the sampler during the warm-up, the learner while the sampler generates); the arrays go through one
collective over all devices (`multihost_utils.broadcast_one_to_all`, bit for bit: every leaf as unsigned integers of
its width) entered by both processes as soon as the message is there: a CPU collective whose two sides arrive more
than ~30 s apart fails (gloo's context deadline; measured here). A sampler that fails answers with its error (the
learner raises a `SamplerError` naming the step); a learner that fails tells the sampler (which raises too); a
process that dies is noticed by the coordination service.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from lrl_jax import quant
from lrl_jax.rollout import Rollout

__all__ = ["role_of", "Link", "encode", "decode"]

_WAIT_MS = 7 * 24 * 3600 * 1000  # the longest a role waits for the other's next message (a week: the warm-up, a step)
_CALLS = itertools.count()  # `rl.train` calls in this process: every process makes the same ones, in the same order


def role_of(cfg, learner_devices, sampler_devices) -> str | None:
  """The role of this process ("learner" or "sampler") in a run whose learner and sampler meshes each lie within one
  process, one process each (two processes); None for any other run (one process; or the SPMD run of `rl.procs`).

  Raises:
    NotImplementedError: a disaggregated run across processes whose meshes share a process, or span several.
  """
  if jax.process_count() == 1 or sampler_devices is None or cfg.run.placement != "disaggregated":
    return None
  owners = [sorted({d.process_index for d in devs}) for devs in (learner_devices, sampler_devices)]
  if jax.process_count() != 2 or any(len(o) != 1 for o in owners) or owners[0] == owners[1]:
    raise NotImplementedError(
      f"run.placement=disaggregated across {jax.process_count()} processes puts the learner's devices in process(es) "
      f"{owners[0]} and the sampler's in {owners[1]}: built is one process each, two in all (the learner's mesh on "
      "one process's devices, sampler.mesh on the other's: e.g. sampler.mesh the size of a process's devices, "
      "learner.mesh=[-1, 1, 1])"
    )
  return "learner" if owners[0][0] == jax.process_index() else "sampler"


def encode(obj) -> tuple[dict, list[np.ndarray]]:
  """(a JSON-able header, the arrays) of a message: dicts, lists, scalars, strings, NumPy / JAX arrays and `Rollout`s,
  nested. `decode` inverts it."""
  arrays: list[np.ndarray] = []

  def enc(x):
    if isinstance(x, Rollout):
      fields = {f.name: enc(getattr(x, f.name)) for f in dataclasses.fields(x) if f.metadata.get("pytree_node", True)}
      return {"__rollout__": fields, "group_size": x.group_size, "prompt_len": x.prompt_len}
    if isinstance(x, (np.ndarray, jax.Array)):
      arrays.append(np.asarray(x))
      return {"__array__": len(arrays) - 1}
    if isinstance(x, np.generic):
      return x.item()
    if isinstance(x, dict):
      return {str(k): enc(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
      return [enc(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
      return x
    raise TypeError(f"a role message cannot carry a {type(x).__name__}: {x!r:.80}")

  body = enc(obj)
  return {"body": body, "arrays": [[list(a.shape), a.dtype.name] for a in arrays]}, arrays


def decode(header: dict, arrays: list[np.ndarray]):
  def dec(x):
    if isinstance(x, dict):
      if "__array__" in x:
        return arrays[x["__array__"]]
      if "__rollout__" in x:
        return Rollout(
          **{k: dec(v) for k, v in x["__rollout__"].items()}, group_size=x["group_size"], prompt_len=x["prompt_len"]
        )
      return {k: dec(v) for k, v in x.items()}
    if isinstance(x, list):
      return [dec(v) for v in x]
    return x

  return dec(header["body"])


def _bits(a: np.ndarray) -> np.ndarray:
  """The array as unsigned integers of its width (the collective adds zeros to them: exact for every value)."""
  a = np.ascontiguousarray(a)
  return a.view(np.dtype(f"u{a.dtype.itemsize}"))


class Link:
  """The messages of one run between the learner's process and the sampler's (`send` on one, `recv` on the other, in
  the same order): the header through the coordination service, then the arrays by one collective."""

  def __init__(self, *, role: str):
    import orbax.checkpoint as ocp  # noqa: PLC0415  (its public handle on jax.distributed's client)

    self.role = role
    self.other = 1 - jax.process_index()
    self._client = ocp.multihost.get_jax_distributed_client()
    self._prefix = f"lrl_jax/roles/{next(_CALLS)}"
    self._sent = self._received = 0

  def _key(self, sender: str, n: int) -> str:
    return f"{self._prefix}/{sender}/{n}"

  def send(self, obj) -> float:
    """Sends `obj` (see `encode`); returns the seconds the arrays' collective took."""
    header, arrays = encode(obj)
    self._client.key_value_set_bytes(self._key(self.role, self._sent), json.dumps(header).encode())
    self._sent += 1
    t0 = time.perf_counter()
    if arrays:
      multihost_utils.broadcast_one_to_all([_bits(a) for a in arrays], is_source=True)
    return time.perf_counter() - t0

  def recv(self):
    """The other role's next message (waits for it: up to a week)."""
    sender = "sampler" if self.role == "learner" else "learner"
    key = self._key(sender, self._received)
    header = json.loads(self._client.blocking_key_value_get_bytes(key, _WAIT_MS))
    self._client.key_value_delete(key)
    self._received += 1
    like = [np.zeros(shape, jnp.dtype(dtype)) for shape, dtype in header["arrays"]]
    if like:
      got = multihost_utils.broadcast_one_to_all([_bits(a) for a in like], is_source=False)
      like = [np.asarray(g).view(a.dtype).reshape(a.shape) for g, a in zip(got, like, strict=True)]
    return decode(header, like)


def tree_message(tree) -> dict:
  """A pytree of arrays (the served weights) as a message part: its leaves (the receiver knows the structure)."""
  leaves = jax.tree_util.tree_leaves(tree)
  return {"leaves": list(leaves), "bytes": int(quant.tree_nbytes(tree))}


def tree_from_message(part: dict, like) -> Any:
  """The pytree of `tree_message` rebuilt on `like`'s structure (ShapeDtypeStructs or arrays), as host arrays."""
  treedef = jax.tree_util.tree_structure(like)
  want = jax.tree_util.tree_leaves(like)
  got = part["leaves"]
  if len(got) != len(want) or any(g.shape != w.shape or g.dtype != w.dtype for g, w in zip(got, want)):
    raise ValueError(
      f"the served weights received ({len(got)} leaves) do not match the tree this sampler serves ({len(want)} leaves);"
      " both processes must run the same config"
    )
  return jax.tree_util.tree_unflatten(treedef, got)


# --------------------------------------------------------------------------- the learner's side


class Remote:
  """The learner's side of the run: what `loop._Rollouts` is to a single process (the step's rollouts, evaluations),
  asked of the sampler's process over a `Link`.

  It keeps the off-policy queue of the weights it sent (`queue`: the same `OffPolicyQueue` rule as the sampler's), so
  the learner's checkpoints hold what the sampler generates the next steps with, as in one process.
  """

  def __init__(self, link: Link):
    self.link = link
    self._queue = None
    self._timings: dict = {}
    self._sent = None  # the served weights the sampler holds (the object `served_weights` returned)
    self.stale_dropped = 0  # batches the sampler dropped for staleness (its count)
    self._stopped = False

  def begin(self, start: int, t_start: float, *, queue, timings: dict) -> Remote:
    """Tells the sampler the RL step the run starts at, the run's clock and the off-policy weights held at a resume
    (`queue`'s, restored from the checkpoint; None: on-policy); the sync's `timings` get the transfer's."""
    self._queue, self._timings = queue, timings
    held = [] if self._queue is None else self._queue.held
    self._call(
      {
        "op": "hello",
        "start": start,
        "epoch0": time.time() - (time.perf_counter() - t_start),
        "held": [[tree_message(w), v] for w, v in held],
      },
      what="the sampler's set-up",
    )
    return self

  def _with_weights(self, msg: dict, served_lora) -> dict:
    if self._sent is not served_lora:
      msg["weights"] = tree_message(served_lora)
      self._sent = served_lora
    return msg

  def _call(self, msg: dict, *, what: str) -> dict:
    from lrl_jax.rl.loop import SamplerError  # noqa: PLC0415

    moved = self.link.send(msg)
    if "weights" in msg:  # the transfer of the served weights: the sync's second half
      q = self._timings.get("sync_quantize_s", self._timings.get("sync_s", 0.0))
      self._timings.update(sync_transfer_s=moved, sync_s=q + moved, sync_bytes=msg["weights"]["bytes"])
    reply = self.link.recv()
    if "error" in reply:
      raise SamplerError(f"the sampler (process {self.link.other}) failed on {what}: {reply['error']}")
    return reply

  def get(self, k: int, served_now, *, last: bool):
    """The rollouts of step k (`loop._Sampled`), given the weights synced at step k."""
    from lrl_jax.rl.loop import _Sampled  # noqa: PLC0415

    if self._queue is not None:
      self._queue.swap(served_now, k)  # the sampler's queue makes the same swap
    reply = self._call(self._with_weights({"op": "step", "k": k, "last": last}, served_now), what=f"RL step {k}")
    self.stale_dropped = reply["stale_dropped"]
    s = reply["sampled"]
    return _Sampled(
      roll=s["roll"],
      rewards=s["rewards"],
      rstats=s["rstats"],
      gen=s["gen"],
      version=s["version"],
      start=s["start"],
      end=s["end"],
    )

  def evaluate(self, served_lora, *, transfer: bool = False, problems: list | None = None) -> dict:
    """`loop.evaluate` of the served weights, by the sampler."""
    msg = {"op": "eval", "transfer": transfer, "problems": problems is not None}
    reply = self._call(self._with_weights(msg, served_lora), what="an evaluation")
    if problems is not None:
      problems.extend(reply["problems"])
    return reply["ev"]

  def wait(self) -> None:
    """Nothing to wait for here: the sampler finishes its thread's step before it evaluates."""

  def close(self) -> None:
    """Nothing held here; `stop` ends the sampler's side."""

  def stop(self, *, result=None, error: BaseException | None = None) -> None:
    """Ends the sampler's side: with the run's result (it returns the same), or the learner's error (it raises)."""
    if self._stopped:
      return
    self._stopped = True
    if error is not None:
      self.link.send({"op": "stop", "error": f"{type(error).__name__}: {error}"})
      return
    d = dataclasses.asdict(result)
    d["out_dir"] = str(d["out_dir"])
    d["records"] = None  # a long run's are megabytes: the sampler's process reads them from metrics.jsonl
    self.link.send({"op": "stop", "result": d})


# --------------------------------------------------------------------------- the sampler's side


def serve(cfg, link: Link, *, task=None):
  """The sampler's process of the run: answers the learner's messages until it stops; returns the run's result (the
  learner's `RunResult`), or raises what stopped the run (its own failure, or one naming the learner's)."""
  from lrl_jax.rl import loop as Lp  # noqa: PLC0415
  from lrl_jax.rl import metrics as M  # noqa: PLC0415
  from lrl_jax.rl.buffer import OffPolicyQueue  # noqa: PLC0415
  from lrl_jax.rl.setup import build_model, new_state, sampler_mesh  # noqa: PLC0415
  from lrl_jax.sampler import shard_params  # noqa: PLC0415
  from lrl_jax.tasks import RewardPool  # noqa: PLC0415

  setup = pool = rollouts = None
  served = None
  start = 0
  failure: BaseException | None = None
  try:
    setup = build_model(cfg, task=task)
    smesh = sampler_mesh(cfg)
    pool = RewardPool.for_task(setup.task, workers=cfg.task.reward_workers) if cfg.task.reward_workers else None
    like = jax.eval_shape(lambda: Lp.served_weights(new_state(cfg, setup, setup.params), setup))
  except Exception as e:  # answered to the learner's first message
    failure = e

  def place(part):
    s, lora = tree_from_message(part, like)
    if lora is not None:
      lora = jax.device_put(lora, jax.sharding.NamedSharding(smesh, jax.sharding.PartitionSpec()))
    return shard_params(s, smesh), lora

  try:
    while True:
      msg = link.recv()
      op = msg["op"]
      if op == "stop":
        if "result" in msg:
          r = msg["result"]
          written = M.read_metrics(r["paths"]["metrics"])  # the learner's process wrote them (a shared file system)
          records = [x for x in written if x["phase"] == "rl" and x["step"] >= start]
          return Lp.RunResult(**{**r, "out_dir": Lp.Path(r["out_dir"]), "records": records})
        if failure is not None:
          raise failure
        raise RuntimeError(f"the learner (process {link.other}) stopped the run: {msg['error']}")
      try:
        if failure is not None:
          raise failure
        if "weights" in msg:
          served = place(msg["weights"])
        if op == "hello":
          start = msg["start"]
          queue = OffPolicyQueue(cfg.run.max_staleness) if cfg.run.off_policy or cfg.run.async_rollouts else None
          if queue is not None and msg["held"]:
            queue.restore([(place(part), v) for part, v in msg["held"]])
          t_start = time.perf_counter() - (time.time() - msg["epoch0"])  # the learner's clock
          sample_key = jax.random.fold_in(jax.random.PRNGKey(cfg.run.seed), 2)
          rollouts = Lp._Rollouts(
            setup,
            cfg,
            queue=queue,
            sample_key=sample_key,
            pool=pool,
            t_start=t_start,
            asynchronous=cfg.run.async_rollouts,
          )
          reply = {"ok": True}
        elif op == "eval":
          rollouts.wait()
          rows: list = []
          ev = Lp.evaluate(served[0], setup, cfg, lora=served[1], transfer=msg["transfer"], problems=rows, pool=pool)
          reply = {"ev": ev, "problems": rows if msg["problems"] else []}
        elif op == "step":
          s = rollouts.get(msg["k"], served, last=msg["last"])
          sampled = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
          reply = {"sampled": sampled, "stale_dropped": rollouts.stale_dropped}
        else:
          raise ValueError(f"unknown message {op!r} from the learner")
      except Exception as e:
        failure = e
        reply = {"error": str(e) if isinstance(e, Lp.SamplerError) else f"{type(e).__name__}: {e}"}
      link.send(reply)
  finally:
    if rollouts is not None:
      rollouts.close()
    if pool is not None:
      pool.close()
