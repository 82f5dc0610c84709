"""Whole programs compiled by XLA:GPU for an NVIDIA GPU that is not here (deviceless ahead-of-time compile).

jax's CUDA plugin (`jax-cuda13-plugin` and `jax-cuda13-pjrt` at jaxlib's own version; `make test-aot` installs
them beside the venv, on the path of that target only) describes a GPU from a target config, the text form of
XLA's `GpuTargetConfigProto`, and compiles for it without a driver or a device (`jax.experimental.topologies`).
What is placed on `chip(name)` (ShapeDtypeStructs) then compiles as it would on that card: XLA:GPU's fusion,
its choice of cuBLAS or Triton for each dot, buffer assignment. Nothing runs: `memory_analysis()` gives the
peak; `cost_analysis()` is not available for such an executable, so its bytes are counted from the optimized HLO
(`lrl_jax.learner.traffic.program_bytes`). Autotuning needs the card, so XLA:GPU picks its kernels' tilings by
its heuristics: the bytes are those of its untuned choice.

Run with JAX_PLATFORMS=cpu (jax computes on the CPU and only compiles for the GPU).

The two cards are the ones this project's device tool lends. Their figures are this workplace's readings of them
where there are some (nvidia-smi's memory and clocks, PyTorch's multiprocessor and L2 counts), else NVIDIA's
datasheets (bus width, SM clock) and the CUDA programming guide's table for compute capability 9.0 (shared memory
228 KiB a multiprocessor, 227 KiB a block when opted in, 64 Ki registers, 2048 threads). The bandwidth is the one a
driver reports, as XLA computes it on a card (2 x memory clock x bus width): XLA:GPU's fusion decisions read it, and
the compiled program is sensitive to it (SmolLM2's all-techniques step peaked 0.1 GiB lower, 4%, with 3.35e12 B/s,
the datasheet's round figure, in place of the H100's 3.352e12, before the learner's skipped-step select).
"""

from __future__ import annotations

import dataclasses

import jax
from jax.experimental import topologies

__all__ = ["TARGETS", "GpuTarget", "chip", "target_config", "topology"]


@dataclasses.dataclass(frozen=True)
class GpuTarget:
  """One NVIDIA card, as XLA:GPU's target config describes it."""

  name: str
  memory_bytes: int  # nvidia-smi's total
  memory_clock_mhz: int
  bus_bits: int
  l2_bytes: int
  cores: int = 132  # multiprocessors
  clock_ghz: float = 1.98
  major: int = 9
  minor: int = 0

  @property
  def bandwidth(self) -> int:
    """Bytes / s, as XLA computes it from what the driver reports: 2 (double data rate) x clock x bus width."""
    return 2 * self.memory_clock_mhz * 10**6 * self.bus_bits // 8


TARGETS = {
  # H100 SXM: 5 HBM3 stacks, 5120 bits, 2619 MHz (3.35 TB/s); read here: 81559 MiB, 132 SMs, 50 MB of L2
  "h100": GpuTarget("NVIDIA H100 80GB HBM3", 81559 * 2**20, memory_clock_mhz=2619, bus_bits=5120, l2_bytes=50 * 2**20),
  # H200 SXM: 6 HBM3e stacks, 6144 bits; read here: 143771 MiB, memory clock 3201 MHz, 132 SMs, 60 MB of L2
  "h200": GpuTarget("NVIDIA H200", 143771 * 2**20, memory_clock_mhz=3201, bus_bits=6144, l2_bytes=60 * 2**20),
}


def target_config(name: str) -> str:
  """The text form of XLA's GpuTargetConfigProto for `name` (a key of TARGETS)."""
  if name not in TARGETS:
    raise ValueError(f"gpu_aot: unknown GPU target {name!r}; known: {sorted(TARGETS)}")
  t = TARGETS[name]
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {228 * 1024}
  shared_memory_per_block_optin: {227 * 1024}
  threads_per_core_limit: 2048
  core_count: {t.cores}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {t.bandwidth}
  l2_cache_size: {t.l2_bytes}
  clock_rate_ghz: {t.clock_ghz}
  device_memory_size: {t.memory_bytes}
  cuda_compute_capability {{ major: {t.major} minor: {t.minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
device_description_str: "{t.name}"
"""


_TOPOS: dict[str, object] = {}


def topology(name: str):
  """jax's description of one `name` GPU (cached); a RuntimeError says how to get the CUDA plugin."""
  if name not in _TOPOS:
    cfg = target_config(name)
    try:
      _TOPOS[name] = topologies.get_topology_desc(name, "cuda", target_config=cfg, topology="1x1x1")
    except Exception as e:  # noqa: BLE001 - jax raises several types here
      raise RuntimeError(
        f"gpu_aot: cannot describe GPU target {name!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); is "
        f"jax's CUDA plugin importable (jax-cuda13-plugin and jax-cuda13-pjrt {jax.__version__}; `make test-aot` "
        "installs them)?"
      ) from e
  return _TOPOS[name]


def chip(name: str) -> jax.sharding.SingleDeviceSharding:
  """One `name` GPU, as a sharding: what is placed there (ShapeDtypeStructs) compiles for it."""
  return jax.sharding.SingleDeviceSharding(topology(name).devices[0])
