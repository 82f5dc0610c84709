"""The API reference's checker (scripts/check_api_docs.py, which `make docs` runs): a broken backticked reference to
the package in a docstring is reported with its name and line, config keys and code snippets are not references,
and a page pdoc built shows every name of the module's `__all__` with its signature."""

import importlib.util
from pathlib import Path

import pytest

import lrl_jax.losses

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_api_docs.py"
_spec = importlib.util.spec_from_file_location("check_api_docs", _SCRIPT)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def test_references_that_resolve_pass():
  doc = """Serves with `quant.qdot(x, q)`, `sampler.serve_params(..., layout="linear")` and `lrl_jax.models.forward`.

  `rl.sync` is a function of its module `rl.sync.SyncSpec`; `models.decoder` a module; a field without a default:
  `learner.TrainState.params`; a called constructor read further: `quant.Int4(group_size=32).qmax`.
  """
  problems, count = check.check_docstring(doc, "x.py")
  assert problems == []
  assert count == 8


def test_config_keys_and_snippets_are_not_broken_references():
  doc = """`sampler.temperature` and `learner.correction.method` are config keys; `quant.sampler=bf16` an override,
  `learner.correction.method: tis` YAML, `[B, T]` a shape, `x.shape` code, `models` a bare module name."""
  problems, count = check.check_docstring(doc, "x.py")
  assert problems == []
  assert count == 2  # the two config keys: read, and resolved as keys of lrl_jax.config.Config


def test_a_broken_reference_is_reported_with_its_name_and_line():
  doc = "First line.\n\nCalls `quant.NoSuchThing(x)` and\n`lrl_jax.models.decoder.no_such_fn`; `sampler.temprature`.\n"
  problems, count = check.check_docstring(doc, "lrl_jax/x.py", first_line=10)
  assert count == 3
  assert len(problems) == 3
  assert problems[0].startswith("lrl_jax/x.py:12: `quant.NoSuchThing(x)` does not resolve")
  assert "lrl_jax.quant has no 'NoSuchThing'" in problems[0]
  assert problems[1].startswith("lrl_jax/x.py:13: `lrl_jax.models.decoder.no_such_fn`")
  assert "lrl_jax.models.decoder has no 'no_such_fn'" in problems[1]
  assert "lrl_jax.sampler has no 'temprature' and it is no config key" in problems[2]


def test_references_are_read_from_every_docstring_of_a_file(tmp_path):
  src = tmp_path / "mod.py"
  src.write_text(
    '"""Module: `quant.qdot`."""\n\n'
    "X = 1\n"
    '"""A variable\'s docstring: `quant.Nope1`."""\n\n\n'
    "class C:\n"
    '  """Class: `losses.Nope2`."""\n\n'
    "  def f(self):\n"
    '    """Method.\n\n    Uses `kernels.Nope3`.\n    """\n'
  )
  problems, count = check.check_references([src])
  assert count == 4
  assert [p.split(": ")[0] for p in problems] == [f"{src}:4", f"{src}:8", f"{src}:13"]


@pytest.fixture(scope="module")
def losses_page(tmp_path_factory):
  # pdoc is in the `test` extra (and the `docs` one): no skip here; `make docs` builds and checks the whole reference
  out = tmp_path_factory.mktemp("api")
  warnings = check.build(out, ["lrl_jax.losses"])
  return warnings, check.page_path(out, "lrl_jax.losses").read_text(encoding="utf-8")


def test_every_name_of_all_is_on_the_page_with_its_signature(losses_page):
  warnings, page = losses_page
  assert warnings == []
  problems, count = check.check_page(page, lrl_jax.losses)
  assert problems == []
  assert count == len(lrl_jax.losses.__all__)


def test_a_missing_name_or_signature_is_reported(losses_page):
  _, page = losses_page
  ppo = check._member_html(page, "ppo_loss")
  page = page.replace(ppo, ppo.split('<span class="signature')[0])  # ppo_loss without its signature
  page = page.replace('id="tis_weights"', 'id="gone"')  # tis_weights not on the page
  page = page.replace('id="ACRLState.__init__"', 'id="gone2"')  # a class without its constructor's signature
  problems, _ = check.check_page(page, lrl_jax.losses)
  assert len(problems) == 3
  assert any(p.startswith("lrl_jax.losses: ppo_loss is rendered without its signature") for p in problems)
  assert any(p.startswith("lrl_jax.losses: tis_weights is in __all__ but not on") for p in problems)
  assert any(p.startswith("lrl_jax.losses: ACRLState is rendered without its constructor") for p in problems)
