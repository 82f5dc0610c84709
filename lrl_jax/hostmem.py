"""Host memory: glibc's malloc keeps the memory XLA frees, so the next step reuses it instead of faulting it in.

XLA:CPU allocates each program's temporaries and outputs with malloc and frees them when the step is done. glibc
hands out blocks over its mmap threshold (at most 32 MiB) as fresh mmaps and unmaps them on free, shrinks the
per-thread arenas of XLA's worker threads with madvise, and trims the top of its main heap: memory goes back to the
kernel, and the next step's first write to each 4 KiB page of it is a page fault (the kernel zeroes the page). A
learner step of SmolLM2 spent as much time in those faults as in its matmuls (`lrl_jax/learner/README.md`).

`keep_freed_memory()` sets three `mallopt` parameters: one arena for all threads (`M_ARENA_MAX` = 1), no mmap-served
blocks (`M_MMAP_MAX` = 0), no trimming (`M_TRIM_THRESHOLD` = SIZE_MAX). Freed blocks then stay in the process's heap
for the next allocation; the price is that the resident size stays at its high-water mark (plus fragmentation) and
that threads share one arena lock, which slows XLA's multi-threaded compiles (a compile-bound run such as `make demo`
takes ~16% longer). `import lrl_jax` calls it when JAX will run on the CPU: `JAX_PLATFORMS` names cpu first, or it is
unset and no accelerator plugin (a `jax_plugins` entry point or module, libtpu) is installed. On an accelerator the
host holds no large per-step buffers, so only the compile cost would remain. `LRL_JAX_KEEP_HOST_MEMORY=1` sets it
regardless, `=0` never.

One race comes with it. XLA:CPU frees a program's temporaries a few milliseconds after its outputs are ready (4-8 ms
in every step of a SmolLM2 learner step at 64 x 72 tokens, 2026-12-06). A next program dispatched inside that window
asks for its own temporaries while the last one's are still allocated, and the heap, which cannot hand a block back,
grows by a whole temporary block for good (+10.4 GB at once there, against a 10.66 GB `temp_size`, in 3 of 4 runs of
4-18 back-to-back steps; the third was killed for memory two steps after it grew). `released()` closes it: wrap
each blocking call that runs a large program in it, and it waits on the way out until the heap's in-use bytes are
back near where they were (the loop's learner and its benchmarks do).

It must run before XLA's CPU backend starts its threads (the first JAX computation or `jax.devices()`): set later,
the worker threads' arenas already exist and keep returning memory. Other C libraries (musl, macOS): nothing is done.
Accelerators allocate device memory with their own allocators; this concerns host memory only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import importlib.metadata
import importlib.util
import os
import time

__all__ = ["keep_freed_memory", "ENV", "state", "in_use", "released"]

ENV = "LRL_JAX_KEEP_HOST_MEMORY"

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

_STATE = "not set"


def _glibc():
  """glibc's shared library, or None when the C library is another one."""
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name or "libc.so.6")
  except OSError:
    return None
  return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def _accelerator_plugins() -> list[str]:
  """The installed packages through which JAX would pick an accelerator over the CPU (found without importing jax's
  backends): `jax_plugins` entry points and modules (CUDA, ROCm, ...) and libtpu."""
  found = [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
  try:
    import jax_plugins  # noqa: PLC0415 (a namespace package; absent unless a plugin is installed)
  except ImportError:
    pass
  else:
    import pkgutil  # noqa: PLC0415

    found += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__) if m.name not in found]
  if importlib.util.find_spec("libtpu") is not None:
    found.append("libtpu")
  return found


def _decide(setting: str, platforms: str, plugins) -> str | None:
  """None to set it, else the reason not to (the `state()` string). `plugins` is called only when it matters."""
  setting = setting.strip().lower()
  if setting in ("0", "false", "no", "off"):
    return f"off ({ENV}=0)"
  if setting in ("1", "true", "yes", "on"):
    return None
  if setting not in ("", "auto"):
    raise ValueError(f"{ENV}={setting!r}: expected 1 (keep), 0 (return) or auto (keep when JAX runs on the CPU)")
  if platforms.strip():
    first = platforms.split(",")[0].strip().lower()
    return None if first == "cpu" else f"off (JAX_PLATFORMS={platforms} runs on {first})"
  found = plugins()
  return f"off (accelerator plugin installed: {', '.join(found)})" if found else None


def keep_freed_memory() -> str:
  """Sets glibc's malloc to keep freed memory when JAX will run on the CPU (module docstring); returns what was done,
  also `state()`.

  Returns:
    "kept" (all three parameters set), "off (<why>)" (`LRL_JAX_KEEP_HOST_MEMORY=0`, or an accelerator will run the
    programs), "not glibc", or "failed: <which>" (a parameter glibc refused).

  Raises:
    ValueError: `LRL_JAX_KEEP_HOST_MEMORY` is not 1, 0 or auto.
  """
  global _STATE
  why_not = _decide(os.environ.get(ENV, "auto"), os.environ.get("JAX_PLATFORMS", ""), _accelerator_plugins)
  if why_not is not None:
    _STATE = why_not
    return _STATE
  libc = _glibc()
  if libc is None:
    _STATE = "not glibc"
    return _STATE
  libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  # M_TRIM_THRESHOLD takes a size_t inside glibc: the int -1 becomes SIZE_MAX, "never trim" (an int can say at most
  # 2 GiB, which a 7B learner's step frees at once).
  settings = {
    "M_ARENA_MAX": (_M_ARENA_MAX, 1),
    "M_MMAP_MAX": (_M_MMAP_MAX, 0),
    "M_TRIM_THRESHOLD": (_M_TRIM_THRESHOLD, -1),
  }
  refused = [name for name, (param, value) in settings.items() if libc.mallopt(param, value) != 1]
  _STATE = f"failed: {', '.join(refused)}" if refused else "kept"
  return _STATE


def state() -> str:
  """What `keep_freed_memory` did in this process ("not set" if it has not run)."""
  return _STATE


class _MallInfo2(ctypes.Structure):
  _fields_ = [
    (n, ctypes.c_size_t)
    for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
  ]


@functools.cache
def _mallinfo2():
  """glibc's `mallinfo2` (>= 2.33), or None."""
  libc = _glibc()
  f = getattr(libc, "mallinfo2", None) if libc is not None else None
  if f is not None:
    f.restype = _MallInfo2
  return f


def in_use() -> int | None:
  """Bytes glibc's malloc has handed out and not had back (`mallinfo2`: heap blocks in use + mmap-served blocks), or
  None where the C library is not glibc (>= 2.33, which has `mallinfo2`)."""
  f = _mallinfo2()
  if f is None:
    return None
  m = f()
  return int(m.uordblks + m.hblkhd)


@contextlib.contextmanager
def released(min_bytes: int = 256 << 20, timeout_s: float = 0.05):
  """Around a blocking call that runs an XLA:CPU program (`jax.block_until_ready` or `device_get` inside): on the way
  out, waits until the program's temporaries are back in the heap (module docstring: the race it closes).

  "Back": the bytes in use (`in_use()`) are at most min_bytes above what they were on the way in. A program whose
  outputs stay (not donated) can leave more in use; the wait then ends after timeout_s. Nothing is done unless
  `state()` is "kept", or when the call left less than min_bytes more in use than it found (small programs never
  wait).
  """
  before = in_use() if _STATE == "kept" else None
  yield
  if before is None:
    return
  end = time.perf_counter() + timeout_s
  while in_use() > before + min_bytes and time.perf_counter() < end:
    time.sleep(0.0005)
