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


_RELEASED_PROBE = r"""
import ctypes, json, threading, time
import lrl_jax
from lrl_jax import hostmem

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
out = {"state": hostmem.state()}
for case, size, free_after in (("late free", 512 << 20, 0.03), ("kept", 512 << 20, None), ("small", 64 << 20, None)):
  block = [None]
  t0 = time.perf_counter()
  with hostmem.released(min_bytes=256 << 20, timeout_s=0.5):
    before = hostmem.in_use()
    block[0] = libc.malloc(size)  # a program's temporaries, still allocated when its outputs are ready
    if free_after is not None:  # ... and freed by another thread a little later, as XLA:CPU's are
      threading.Timer(free_after, libc.free, (block[0],)).start()
  waited = time.perf_counter() - t0
  out[case] = {"waited": waited, "over": hostmem.in_use() - before}
  if free_after is None:
    libc.free(block[0])
print(json.dumps(out))
"""


@_glibc_only
def test_released_waits_for_a_late_free():
  """`hostmem.released()` waits on the way out until what the call allocated is back (here: 512 MiB that a timer
  thread frees 30 ms after the call returns, as XLA:CPU frees a program's temporaries after its outputs are ready);
  a block that stays ends the wait at the timeout; one under min_bytes is not waited for."""
  env = {**os.environ, "LRL_JAX_KEEP_HOST_MEMORY": "1", "JAX_PLATFORMS": "cpu"}
  res = subprocess.run([sys.executable, "-c", _RELEASED_PROBE], env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  r = json.loads(res.stdout.strip().splitlines()[-1])
  assert r["state"] == "kept"
  assert 0.03 <= r["late free"]["waited"] < 0.5, r  # waited for the free, not for the timeout
  assert r["late free"]["over"] < 256 * MiB, r  # and the block was back
  assert r["kept"]["waited"] >= 0.5 and r["kept"]["over"] >= 512 * MiB, r  # never freed: the timeout ends it
  assert r["small"]["waited"] < 0.03, r  # under min_bytes: no wait
