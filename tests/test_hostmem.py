"""`lrl_jax.hostmem`: importing lrl_jax makes glibc keep the memory XLA frees (no mmap-served blocks, no trim).

Each case runs a fresh Python (the setting must precede XLA's CPU backend) that imports lrl_jax, runs a jitted
function with a 64 MiB output, and reads glibc's own accounting (`mallinfo2`): where the output's block came from
(mmap or the heap) and whether the heap gave memory back when it was freed. 64 MiB is over glibc's largest default
mmap threshold (32 MiB), so with the library's setting off the block is mmap-served: the control.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

_glibc_only = pytest.mark.skipif(
  platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only (hostmem is a no-op)"
)

MiB = 1 << 20

_PROBE = r"""
import ctypes, gc, json
import lrl_jax  # sets it (or not: LRL_JAX_KEEP_HOST_MEMORY=0)
import jax, jax.numpy as jnp
from lrl_jax import hostmem

class MallInfo2(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                             "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
f = jax.jit(lambda x: jnp.broadcast_to(x, (16, 1024, 1024)) + 1.0)  # a 64 MiB float32 output
x = jnp.ones((1024, 1024), jnp.float32)
f(x).block_until_ready()  # compiled and run once
gc.collect()
before = libc.mallinfo2()
y = f(x)
y.block_until_ready()
alive = libc.mallinfo2()
del y
gc.collect()
after = libc.mallinfo2()
print(json.dumps(dict(
  state=hostmem.state(),
  mmapped=alive.hblkhd - before.hblkhd,  # bytes in mmap-served blocks, added while the output lives
  heap_after=after.arena, heap_alive=alive.arena,  # the heap's size from the system, before / after the free
)))
"""


def _probe(keep: str) -> dict:
  env = {**os.environ, "LRL_JAX_KEEP_HOST_MEMORY": keep, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)  # one device is enough
  out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@_glibc_only
def test_import_keeps_freed_memory_in_the_heap():
  r = _probe("1")
  assert r["state"] == "kept"
  assert r["mmapped"] == 0, r  # M_MMAP_MAX = 0: the 64 MiB output came from the heap
  assert r["heap_alive"] >= 64 * MiB, r
  assert r["heap_after"] == r["heap_alive"], r  # freeing it gave nothing back (no trim)


@_glibc_only
def test_off_leaves_glibc_default_the_control():
  r = _probe("0")
  assert r["state"] == "off (LRL_JAX_KEEP_HOST_MEMORY=0)"
  assert r["mmapped"] >= 64 * MiB, r  # glibc's default: a block over the mmap threshold is an mmap


def _no_plugins():
  return []


def _cuda_plugin():
  return ["cuda"]


def test_auto_keeps_only_where_jax_runs_on_the_cpu():
  from lrl_jax.hostmem import _decide

  def plugins_unasked():
    raise AssertionError("the plugins are looked up only when JAX_PLATFORMS is unset")

  assert _decide("auto", "cpu", plugins_unasked) is None
  assert _decide("", "cpu,cuda", plugins_unasked) is None
  assert _decide("auto", "cuda,cpu", plugins_unasked) == "off (JAX_PLATFORMS=cuda,cpu runs on cuda)"
  assert _decide("auto", "", _no_plugins) is None
  assert _decide("auto", "", _cuda_plugin) == "off (accelerator plugin installed: cuda)"
  assert _decide("1", "tpu", plugins_unasked) is None  # forced
  assert _decide("0", "cpu", plugins_unasked) == "off (LRL_JAX_KEEP_HOST_MEMORY=0)"
  with pytest.raises(ValueError, match="LRL_JAX_KEEP_HOST_MEMORY='maybe'"):
    _decide("maybe", "cpu", plugins_unasked)


class _Clock:
  """A virtual clock for `hostmem.released()`: sleep advances it; in_use() reads a block that is freed at `free_at`."""

  def __init__(self, base, block, free_at):
    self.t, self.sleeps, self.base, self.block, self.free_at, self.started = 0.0, 0, base, block, free_at, False

  def perf_counter(self):
    return self.t

  def sleep(self, s):
    self.sleeps += 1
    self.t += s

  def in_use(self):
    held = self.block if (self.free_at is None or self.t < self.free_at) else 0
    return self.base + (held if self.started else 0)


@pytest.mark.parametrize(
  "case, block, free_at, waits_until",
  [
    ("late free", 512 * MiB, 0.03, "free"),  # XLA:CPU frees a program's temporaries after its outputs are ready
    ("never freed", 512 * MiB, None, "timeout"),  # outputs that stay: the timeout ends the wait
    ("small", 64 * MiB, None, "no wait"),  # under min_bytes
  ],
)
def test_released_waits_until_the_call_s_memory_is_back(case, block, free_at, waits_until, monkeypatch):
  """`hostmem.released()` on a virtual clock and heap: on the way out it polls `in_use()` until the bytes are back
  within min_bytes of the way in, or until timeout_s; a call that left less than min_bytes more never polls."""
  from lrl_jax import hostmem

  clock = _Clock(base=3 << 30, block=block, free_at=free_at)
  monkeypatch.setattr(hostmem, "_STATE", "kept")
  monkeypatch.setattr(hostmem, "in_use", clock.in_use)
  monkeypatch.setattr(hostmem, "time", clock)
  with hostmem.released(min_bytes=256 * MiB, timeout_s=0.5):
    clock.started = True  # the call allocates its block
  if waits_until == "free":
    assert free_at <= clock.t < 0.5 and clock.in_use() == clock.base
  elif waits_until == "timeout":
    assert clock.t >= 0.5 and clock.in_use() == clock.base + block
  else:
    assert clock.sleeps == 0 and clock.t == 0.0


def test_released_does_nothing_unless_memory_is_kept(monkeypatch):
  from lrl_jax import hostmem

  def unasked():
    raise AssertionError("in_use() is read only while the memory is kept")

  monkeypatch.setattr(hostmem, "_STATE", "off (LRL_JAX_KEEP_HOST_MEMORY=0)")
  monkeypatch.setattr(hostmem, "in_use", unasked)
  with hostmem.released():
    pass


_IN_USE_PROBE = r"""
import ctypes, json
from lrl_jax import hostmem

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before = hostmem.in_use()
block = libc.malloc(64 << 20)
held = hostmem.in_use() - before
libc.free(block)
print(json.dumps({"held": held, "after": hostmem.in_use() - before}))
"""


@_glibc_only
@pytest.mark.parametrize("keep", ["1", "0"])
def test_in_use_counts_a_malloc(keep):
  """`in_use()` is glibc's own count, heap or mmap-served (a fresh Python, nothing else allocating): a 64 MiB malloc
  adds 64 MiB, its free takes them back, both within 1 MiB: Python's own small-object allocator may take one arena
  (1 MiB at most) from malloc in between."""
  env = {**os.environ, "LRL_JAX_KEEP_HOST_MEMORY": keep, "JAX_PLATFORMS": "cpu"}
  res = subprocess.run([sys.executable, "-c", _IN_USE_PROBE], env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  r = json.loads(res.stdout.strip().splitlines()[-1])
  assert abs(r["held"] - 64 * MiB) <= MiB, r
  assert abs(r["after"]) <= MiB, r
