"""The jax/jaxlib adapter: every entry point resolves on the installed jax, each falls back to its next
spelling when the first is gone, and a jaxlib with none of them is one clear error, not an ImportError."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import ScalifyError

CACHED = (_jaxlib._hlo_module_from_text, _jaxlib._hlo_to_stablehlo, _jaxlib.hlo_sharding_class,
          _jaxlib._context_maker)

HLO = """HloModule m
ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}
"""


@pytest.fixture
def fresh() -> Iterator[None]:
    """Resolve entry points anew in the test, and leave the real ones cached after it."""
    for f in CACHED:
        f.cache_clear()
    yield
    for f in CACHED:
        f.cache_clear()


def _block(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for name in modules:  # a None entry in sys.modules makes `import name` raise ImportError
        monkeypatch.setitem(sys.modules, name, None)


def test_every_entry_point_resolves_on_the_installed_jax() -> None:
    assert {"stablehlo", "sdy", "func", "chlo", "mhlo"} <= set(_jaxlib.dialects())
    module = _jaxlib.hlo_module_from_text(HLO)
    assert module.name == "m"
    assert _jaxlib.hlo_proto_to_stablehlo(module.as_serialized_hlo_module_proto())
    assert str(_jaxlib.hlo_sharding_class().from_string("{replicated}")) == "{replicated}"
    with _jaxlib.make_context():
        assert "stablehlo.negate" in str(_jaxlib.ir().Module.parse(
            "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
            "  %0 = stablehlo.negate %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}"))


def test_a_missing_spelling_falls_back_to_the_next(monkeypatch: pytest.MonkeyPatch, fresh: None) -> None:
    _block(monkeypatch, "jaxlib._hlo")
    assert _jaxlib.hlo_module_from_text(HLO).name == "m"  # through jaxlib.xla_client
    assert _jaxlib.hlo_sharding_class().__name__ == "HloSharding"


def test_our_own_context_has_every_dialect_jax_emits(monkeypatch: pytest.MonkeyPatch, fresh: None) -> None:
    _block(monkeypatch, "jax._src.interpreters.mlir")
    text = ('sdy.mesh @mesh = <["x"=2]>\n'
            "func.func @f(%a: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{\"x\"}]>}) -> tensor<4xf32> {\n"
            "  %0 = chlo.erf %a : tensor<4xf32> -> tensor<4xf32>\n  %1 = stablehlo.negate %0 : tensor<4xf32>\n"
            "  return %1 : tensor<4xf32>\n}")
    with _jaxlib.make_context():
        assert "chlo.erf" in str(_jaxlib.ir().Module.parse(text))
    assert _jaxlib._context_maker() is _jaxlib._own_context


def test_no_spelling_left_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, fresh: None) -> None:
    _block(monkeypatch, "jaxlib._hlo", "jaxlib.xla_client", "jaxlib.xla_extension")
    with pytest.raises(_jaxlib.JaxlibAdapterError) as info:
        _jaxlib.hlo_module_from_text(HLO)
    err = info.value
    assert isinstance(err, ScalifyError) and err.entry.startswith("HLO text parser")
    assert len(err.tried) == 3
    message = err.render()
    for needle in ("jaxlib._hlo.hlo_module_from_text", "jaxlib.xla_client.hlo.hlo_module_from_text",
                   f"jax {_jaxlib.jax_version()}", _jaxlib.SUPPORTED):
        assert needle in message, message
