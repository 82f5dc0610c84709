"""Low-precision Adam moments (learner/adam8.py: m in blockwise E4M3, v in bfloat16): the stored m against the E4M3
format's own rounding bound and an ml_dtypes cast, stochastic rounding's bias, one update against a float64 NumPy
Adam step from the stored state, the state's bytes, sharding on a mesh and an orbax round trip through the learner."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _learner_util import make_batch, tiny_cfg
from jax.extend.core import Var

from lrl_jax import learner as L
from lrl_jax.learner.adam8 import block_size, decode_moment, encode_moment, scale_by_adam_8bit


def _np_encode(x, b):
  """float64 reference of the blockwise absmax E4M3 moment: (codes as float64, scale per block)."""
  xb = x.reshape(x.shape[:-1] + (x.shape[-1] // b, b)).astype(np.float32)
  s = (np.abs(xb).max(-1, keepdims=True) / np.float32(448)).astype(np.float32)
  s = np.where(s > 0, s, np.float32(1))
  codes = np.clip(xb / s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
  return codes.astype(np.float64), s.astype(np.float64)


def test_moments_round_trip_within_the_e4m3_bound():
  """|decode(encode(x)) − x| <= 2^-4·|x| (3 mantissa bits, round to nearest) + 2^-10·s_b (below the normal range,
  2^-6·s_b: the subnormal spacing 2^-9·s_b, halved); codes equal an ml_dtypes cast."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 768)) * np.exp(rng.uniform(-12, 2, (3, 768)))  # ~6 decades within a block
  x[1, :256] = 0.0  # an all-zero block
  b = block_size(768, 256)
  assert b == 256 and block_size(576, 256) == 192 and block_size(7, 256) == 7
  codes, scale = encode_moment(jnp.asarray(x, jnp.float32), 256)
  assert codes.dtype == jnp.float8_e4m3fn and codes.shape == x.shape and scale.shape == (3, 3)
  got = np.asarray(decode_moment(codes, scale, 256), np.float64)
  want_codes, want_s = _np_encode(x, b)
  np.testing.assert_array_equal(np.asarray(codes).astype(np.float64), want_codes.reshape(x.shape))
  s_el = np.repeat(want_s[..., 0], b, axis=-1)
  x32 = x.astype(np.float32).astype(np.float64)
  assert np.all(np.abs(got - x32) <= 2.0**-4 * np.abs(x32) + 2.0**-10 * s_el)
  assert np.all(got[1, :256] == 0)


def test_update_is_adam_on_the_stored_moments(monkeypatch):
  """Step 2's update == a float64 NumPy Adam step from the decoded state (bias-corrected), to f32 rounding; step 1's
  == exact Adam (nothing stored yet); v is stored as bfloat16. "s" is a stacked leaf, updated a layer at a time
  (`_SLICE` = one layer of it: 3 slices)."""
  from lrl_jax.learner import adam8

  monkeypatch.setattr(adam8, "_SLICE", 4 * 512)
  rng = np.random.default_rng(1)
  p = {
    "w": jnp.asarray(rng.standard_normal((4, 512)), jnp.float32),
    "b": jnp.zeros((512,), jnp.float32),
    "s": jnp.asarray(rng.standard_normal((3, 4, 512)), jnp.float32),
  }
  tx = scale_by_adam_8bit(0.9, 0.999, 1e-8, block=256)
  st = tx.init(p)
  g1 = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), p)
  u1, st = tx.update(g1, st)
  for k in p:
    g = np.asarray(g1[k], np.float64)
    want = (0.1 * g / 0.1) / (np.sqrt(0.001 * g * g / 0.001) + 1e-8)  # = sign(g) up to eps
    np.testing.assert_allclose(np.asarray(u1[k]), want, rtol=1e-5, atol=1e-6)
    assert st.v[k].dtype == jnp.bfloat16
  g2 = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(x.shape) * 1e-3, jnp.float32), p)
  u2, st2 = tx.update(g2, st)
  for k in p:
    m = np.asarray(decode_moment(st.m_codes[k], st.m_scale[k], 256), np.float64)
    v = np.asarray(st.v[k], np.float64)
    g = np.asarray(g2[k], np.float64)
    m2, v2 = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    want = (m2 / (1 - 0.9**2)) / (np.sqrt(v2 / (1 - 0.999**2)) + 1e-8)
    np.testing.assert_allclose(np.asarray(u2[k]), want, rtol=1e-5, atol=1e-6)  # f32 arithmetic: ~10 ulps
  assert int(st2.count) == 2


def test_state_bytes_are_smaller():
  """m: 1 + 4/b bytes, v: 2, per element (float32 Adam: 4 + 4): 8 / (3 + 4/b) ≈ 2.65x at b = 256."""
  p = {"w": jnp.zeros((512, 1024)), "v": jnp.zeros((1024, 576))}
  f32 = L.make_optimizer(L.LearnerConfig(lr=1e-3, grad_clip=None)).init(p)
  q8 = L.make_optimizer(L.LearnerConfig(lr=1e-3, grad_clip=None, opt_state_dtype="fp8")).init(p)
  nbytes = lambda t: sum(x.nbytes for x in jax.tree_util.tree_leaves(t))  # noqa: E731
  n = 512 * 1024 + 1024 * 576
  scales = 4 * (512 * 1024 / 256 + 1024 * 576 / 192)  # 576 = 3·192
  assert nbytes(f32) == 8 * n + 8 and nbytes(q8) == 3 * n + scales + 8  # + two int32 step counts each
  assert nbytes(f32) / nbytes(q8) > 2.6


def _fp8_step():
  mc = tiny_cfg()
  cfg = L.LearnerConfig(lr=1e-3, compute_dtype="float32", opt_state_dtype="fp8", opt_state_block=16)
  st = L.create_train_state(jax.random.PRNGKey(0), mc, cfg)
  batch = make_batch(0, mc, st.params)
  one, m1 = L.train_step(st, batch, model_cfg=mc, cfg=cfg)
  return mc, cfg, batch, one, m1


def test_fp8_state_checkpoints_bit_for_bit(tmp_path):
  """The state after a learner step with 8-bit moments survives an orbax round trip bit for bit."""
  *_, one, _ = _fp8_step()
  ck = L.Checkpointer(tmp_path / "ck", save_every=1)
  ck.save(one)
  ck.wait()
  back = ck.restore_latest(one)
  ck.close()
  for a, b in zip(jax.tree_util.tree_leaves(one.opt_state), jax.tree_util.tree_leaves(back.opt_state)):
    assert a.dtype == b.dtype
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.slow  # an 8-device compile (~25 s here): `make test-slow`
def test_fp8_state_shards():
  """A learner step with 8-bit moments on a (2, 2, 2) mesh (block scales replicated where a mesh axis does not divide
  them) equals the single-device step to f32 reordering."""
  mc, cfg, batch, one, m1 = _fp8_step()
  mesh = L.make_mesh(data=2, fsdp=2, tensor=2)
  st_m = L.create_train_state(jax.random.PRNGKey(0), mc, cfg, mesh=mesh)
  sharded, m8 = L.train_step(st_m, L.shard_batch(batch, mesh), model_cfg=mc, cfg=cfg, mesh=mesh)
  assert float(m8["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(one.params), jax.tree_util.tree_leaves(sharded.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)  # ≤ 2·lr·(f32 reordering / ε) as in make_batch


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
  """With a key, each code is one of the two E4M3 neighbours of the value (so within 2^-3·|x| + 2^-9·s_b), and the
  mean over 4096 draws is the value within 6 standard errors (each draw's spread is at most one code width)."""
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.standard_normal((1, 256)) * np.exp(rng.uniform(-6, 0, (1, 256))), jnp.float32)
  keys = jax.random.split(jax.random.PRNGKey(0), 4096)
  enc = jax.vmap(lambda k: decode_moment(*encode_moment(x, 256, k), 256))(keys)
  _, s = encode_moment(x, 256)
  s = float(s[0, 0])
  x64 = np.asarray(x, np.float64)
  assert np.all(np.abs(np.asarray(enc) - x64) <= 2.0**-3 * np.abs(x64) + 2.0**-9 * s)
  width = 2.0**-3 * np.abs(x64) + 2.0**-9 * s
  assert np.all(np.abs(np.asarray(enc).mean(0) - x64[0]) <= 6 * width[0] / 2 / np.sqrt(4096))


_E4M3_GRID = np.arange(0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # its codes 0 .. 448


def _stochastic_rule(y, noise):
  """The stochastic E4M3 rounding in float64 NumPy, as uint8 bit patterns: lo and hi the E4M3 neighbours of |y| on
  ml_dtypes' grid, up iff the low 16 bits of the noise over 2^16 are below (|y| − lo) / (hi − lo) (exact in
  float64: the gap is a power of two), the sign put back on a non-zero code (zero is 0x00); a NaN stores 448
  (0x7E)."""
  grid = _E4M3_GRID
  y = np.asarray(y, np.float64)
  a = np.nan_to_num(np.abs(y), nan=448.0)
  i = np.searchsorted(grid, a, side="right") - 1  # lo = grid[i] <= a
  lo, hi = grid[i], grid[np.minimum(i + 1, len(grid) - 1)]
  p_up = np.where(hi > lo, (a - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
  mag = np.where((np.asarray(noise, np.uint32) & 0xFFFF) / 2.0**16 < p_up, hi, lo)
  return np.where((y < 0) & (mag > 0), -mag, mag).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def test_stochastic_rounding_is_the_rule_bit_for_bit():
  """`_e4m3_stochastic_bits` (float and integer arithmetic, no f8 convert) against the rule in float64 NumPy, code
  for code: at every code, midway between codes, one f32 ulp either side of each, and 2 x 20000 random values over
  26 binades, both signs, and NaN and zero of both signs."""
  from lrl_jax.learner import adam8

  rng = np.random.default_rng(5)
  grid = _E4M3_GRID
  g32 = grid.astype(np.float32)
  y = np.concatenate(
    [
      g32,
      ((grid[:-1] + grid[1:]) / 2).astype(np.float32),
      np.nextafter(g32, np.float32(0)),
      np.nextafter(g32, np.float32(448)),
      rng.uniform(0, 448, 20000).astype(np.float32),
      np.exp(rng.uniform(-18, 6, 20000)).clip(0, 448).astype(np.float32),
    ]
  )
  y = np.concatenate([y, -y, np.float32([np.nan, -np.nan, np.nan, -np.nan])])
  noise = rng.integers(0, 2**32, y.shape, dtype=np.uint64).astype(np.uint32)
  noise[-4:] = [0, 0, 0xFFFF, 0xFFFF]
  got = np.asarray(jax.jit(adam8._e4m3_stochastic_bits)(jnp.asarray(y), jnp.asarray(noise)))
  np.testing.assert_array_equal(got, _stochastic_rule(y, noise))


def test_the_update_stores_the_rule(monkeypatch):
  """The update rounds m with `_e4m3_stochastic_bits`, in a stacked leaf's loop and on a whole 2-D leaf; with the
  float64 NumPy rule in its place (a host callback), two steps' updates and states are the same bits."""
  from lrl_jax.learner import adam8

  monkeypatch.setattr(adam8, "_SLICE", 2 * 4 * 512)  # two layers a slice
  rng = np.random.default_rng(6)
  p = {"s": jnp.zeros((4, 4, 512), jnp.float32), "w": jnp.zeros((4, 512), jnp.float32)}
  draw = lambda x, k: jnp.asarray(rng.standard_normal(x.shape) * 10.0**-k, jnp.float32)  # noqa: E731
  gs = [jax.tree_util.tree_map(lambda x, k=k: draw(x, k), p) for k in (0, 3)]

  def two_steps():
    tx = scale_by_adam_8bit(block=256)
    st = tx.init(p)
    out = []
    for g in gs:
      u, st = jax.jit(tx.update)(g, st)
      out += [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves((u, st))]
    return out

  arithmetic = two_steps()
  calls = []

  def rule(y, noise):
    calls.append(y.shape)
    shape = jax.ShapeDtypeStruct(y.shape, jnp.uint8)
    return jax.pure_callback(_stochastic_rule, shape, y, noise, vmap_method="broadcast_all")

  monkeypatch.setattr(adam8, "_e4m3_stochastic_bits", rule)
  assert two_steps() == arithmetic
  assert len(calls) >= 2  # the loop's body and the 2-D leaf: the rule was used


def test_rounding_bits_are_jax_random_bits_without_a_loop():
  """`_bits` (Threefry-2x32 written out from the paper, straight-line) draws what
  `jax.random.bits(key, shape, uint32)` draws, bit for bit, alone and vmapped over keys as the stacked leaves' loop
  draws them, and XLA:CPU's program for it has no loop (jax's own rolls the rounds on the CPU)."""
  from lrl_jax.learner import adam8

  key = jax.random.fold_in(jax.random.key(3, impl="threefry2x32"), 11)
  for shape in ((1,), (7,), (5, 3), (2, 3, 257)):
    want = jax.random.bits(key, shape, jnp.uint32)
    np.testing.assert_array_equal(np.asarray(adam8._bits(key, shape)), np.asarray(want))
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(4))
  got = jax.vmap(lambda k: adam8._bits(k, (6, 5)))(keys)
  want = jnp.stack([jax.random.bits(keys[i], (6, 5), jnp.uint32) for i in range(4)])
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  hlo = jax.jit(lambda k: adam8._bits(k, (64, 64))).lower(key).compile().as_text()
  assert "while" not in hlo


def _depends_on(jaxpr, sources) -> set:
  """The variables of `jaxpr` (top level; a nested call counts as one node) that depend on any of `sources`."""
  dep = set(sources)
  for eqn in jaxpr.eqns:
    if any(isinstance(v, Var) and v in dep for v in eqn.invars):
      dep.update(eqn.outvars)
  return dep


def _nested_eqns(jaxpr):
  """The equations of `jaxpr` and of every jaxpr nested in them (a loop's body, a conditional's branches)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for v in eqn.params.values():
      for sub in v if isinstance(v, tuple | list) else (v,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _nested_eqns(inner)


def test_rounding_draws_wait_for_the_gradients():
  """Each leaf's rounding bits are drawn from a key that depends on its gradient: a whole leaf's through `adam8._tie`
  (without it XLA:CPU drew them at the train step's start, as they depend on the count only, and kept them live
  through the backward pass's peak: +23 GiB at Qwen2.5-7B shapes with 2 layers), a stacked leaf's inside the loop over
  its layers, which reads the gradient. One draw per leaf (both roundings share its 32 bits)."""
  p = {"a": jnp.zeros((4, 512)), "b": jnp.zeros((512,)), "c": jnp.zeros((2, 256)), "s": jnp.zeros((3, 4, 256))}
  tx = scale_by_adam_8bit(block=256)
  st = tx.init(p)
  closed = jax.make_jaxpr(tx.update)(p, st)
  g_vars = closed.jaxpr.invars[:4]  # the gradient leaves come first (the updates argument), in tree order a, b, c, s
  is_draw = lambda e: e.primitive.name in ("jit", "pjit") and e.params.get("name") == "_bits"  # noqa: E731
  draws = [e for e in closed.jaxpr.eqns if is_draw(e)]
  loops = [e for e in closed.jaxpr.eqns if e.primitive.name in ("scan", "while")]
  assert len(draws) == 3 and len(loops) == 1  # a, b, c whole; s in a loop, which draws its bits inside
  assert any(is_draw(sub) for sub in _nested_eqns(loops[0].params["jaxpr"].jaxpr))
  for j, g in enumerate(g_vars):
    dep = _depends_on(closed.jaxpr, [g])
    for i, e in enumerate(draws + loops):
      assert any(v in dep for v in e.invars if isinstance(v, Var)) == (j == i), (j, i)


def test_a_stacked_leaf_draws_alike_whatever_its_slices(monkeypatch):
  """The loop over a stacked leaf's layers takes `_layers_per_slice` layers at a time; its bits are drawn per layer
  (fold_in of the layer's index), so the update and the stored state are the same bits for any slice size."""
  from lrl_jax.learner import adam8

  assert adam8._layers_per_slice((30, 576, 1536)) == 3 and adam8._layers_per_slice((28, 3584, 18944)) == 1
  assert adam8._layers_per_slice((6, 1, 3)) == 6  # all of it, where it fits one slice
  rng = np.random.default_rng(4)
  p = {"s": jnp.asarray(rng.standard_normal((6, 4, 512)), jnp.float32)}
  g = {"s": jnp.asarray(rng.standard_normal((6, 4, 512)), jnp.float32)}

  def two_steps():
    tx = scale_by_adam_8bit(block=256)
    _, st = tx.update(g, tx.init(p))
    return tx.update(jax.tree_util.tree_map(lambda x: x * 1e-3, g), st)

  runs = []
  for per_slice in (6, 3, 2, 1):  # layers a slice: _SLICE = that many layers of 2048 elements
    monkeypatch.setattr(adam8, "_SLICE", per_slice * 4 * 512)
    assert adam8._layers_per_slice((6, 4, 512)) == per_slice
    runs.append([np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(two_steps())])
  assert all(r == runs[0] for r in runs[1:])


def test_the_clip_inside_equals_optax_clip_before():
  """make_optimizer with 8-bit moments clips inside `scale_by_adam_8bit` (slice by slice): the same update and state,
  bit for bit, as optax.clip_by_global_norm chained before it, with the clip active (step 1) and not (step 2), and
  the same state tree (so a checkpoint of either restores into the other)."""
  import optax

  from lrl_jax.learner.state import _decay_mask, make_schedule

  rng = np.random.default_rng(5)
  p = {"w": jnp.asarray(rng.standard_normal((4, 512)), jnp.float32), "s": jnp.zeros((3, 4, 256), jnp.float32)}
  cfg = L.LearnerConfig(lr=1e-3, opt_state_dtype="fp8", grad_clip=1.0, weight_decay=0.1)
  inner = L.make_optimizer(cfg)
  chained = optax.chain(
    optax.clip_by_global_norm(1.0),
    scale_by_adam_8bit(cfg.b1, cfg.b2, cfg.eps, block=cfg.opt_state_block),
    optax.add_decayed_weights(cfg.weight_decay, _decay_mask),
    optax.scale_by_learning_rate(make_schedule(cfg)),
  )
  g = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), p)  # norm ~ 60
  results = []
  for tx in (inner, chained):
    st = tx.init(p)
    u1, st = tx.update(g, st, p)
    u2, st = tx.update(jax.tree_util.tree_map(lambda x: x * 1e-3, g), st, p)  # norm ~ 0.06: not clipped
    results.append((u1, u2, st))
  assert jax.tree_util.tree_structure(results[0][2]) == jax.tree_util.tree_structure(results[1][2])
  for a, b in zip(jax.tree_util.tree_leaves(results[0]), jax.tree_util.tree_leaves(results[1])):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_stacked_leaf_updates_in_slices_of_memory(monkeypatch):
  """The compiled update of a stacked leaf (clip, 8-bit Adam, decay, learning rate, the new parameters; parameters
  and state donated) holds the update (4 bytes a parameter) and one slice's work, not the rounding bits and m of every
  element at once. Bound: 4 bytes a parameter + 64 bytes (16 words) an element of one slice: its inputs, its results and
  its f32 intermediates; 42 measured on jax 0.10.2 and 0.11.2 (110 before `adam8._apart`, whose copies of the whole
  leaf's state counted here), 5.3 bytes a parameter with 32 slices; the whole-leaf update this replaced took 23."""
  import optax

  from lrl_jax.learner import adam8

  shape, per_slice = (32, 256, 1024), 256 * 1024
  monkeypatch.setattr(adam8, "_SLICE", per_slice)  # one layer a slice
  n = 32 * per_slice
  params = {"w": jax.ShapeDtypeStruct(shape, jnp.float32)}
  tx = L.make_optimizer(L.LearnerConfig(lr=1e-3, opt_state_dtype="fp8", grad_clip=1.0))
  st = jax.eval_shape(tx.init, params)

  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  m = jax.jit(step, donate_argnums=(0, 1)).lower(params, st, params).compile().memory_analysis()
  assert m.temp_size_in_bytes <= 4 * n + 64 * per_slice, m.temp_size_in_bytes / n


def test_a_stacked_leaf_is_written_in_place(monkeypatch):
  """The CPU program of a stacked leaf's update copies none of the leaf's buffers: each slice's new state is computed
  apart from its in-place writes (`adam8._apart`). With the computation fused into the writes, XLA:CPU copied the
  codes, scales and v whole in every slice (2.1 of the 5.7 GB an update of a [30, 576, 1536] leaf moved). And its
  rounding bits are hashed once."""
  import re

  from lrl_jax.learner import adam8

  shape = (8, 64, 512)
  monkeypatch.setattr(adam8, "_SLICE", 2 * 64 * 512)  # two layers a slice: four slices
  p = {"s": jnp.zeros(shape, jnp.float32)}
  tx = scale_by_adam_8bit(block=256)
  st = tx.init(p)
  hlo = jax.jit(tx.update, donate_argnums=1).lower(p, st).compile().as_text()
  assert re.search(r"while\(", hlo)  # the leaf is updated in a loop over its slices
  whole = re.compile(r"= \w+\[8,64,(512|2)\]\{[^}]*\} copy\(")  # the leaf's u, codes, v or its m scales
  assert not [line for line in hlo.splitlines() if whole.search(line)]
  # the slice's rounding bits, drawn once for both moments: one computation holds the 20-round hash (20 xors and
  # more), where XLA:CPU fused it into m's rounding and v's and computed it twice when it was drawn inside
  hashes = [c for c in re.split(r"\n(?=%|ENTRY)", hlo) if c.count(" xor(") >= 20]
  assert len(hashes) == 1, [c.split(" ")[0] for c in hashes]
