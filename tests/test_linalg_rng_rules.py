"""The layout rules of Cholesky/triangular solves and `rng_bit_generator` on shard_map programs: what is
not modelled is never `equivalent`.

- a Cholesky factor of matrix blocks (both matrix dims split): not equivalent;
- a batch-split Cholesky is proven (the fixtures `lr_*` cover solves and replicated keys in full);
- random bits drawn from per-device keys: proven against the reference that draws from each key, a
  discrepancy against one that swaps them.
"""

from __future__ import annotations

from conftest import numeric_xla_flags

numeric_xla_flags()  # before jax is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalify_hlo.jax import check_shard_map  # noqa: E402


def _mesh(n: int) -> jax.sharding.Mesh:
    return jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])


def _spd(x: jax.Array) -> jax.Array:
    return x @ jnp.swapaxes(x, -1, -2) + x.shape[-1] * jnp.eye(x.shape[-2], dtype=x.dtype)


def test_cholesky_of_matrix_blocks_is_not_equivalent() -> None:
    """Both matrix dims split (a 2 x 2 mesh): each device factors a block, which is not a block of the
    factor."""
    x = np.random.default_rng(0).standard_normal((4, 8, 8)).astype(np.float32)
    s = np.asarray(_spd(jnp.asarray(x)))
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:4])
    report = check_shard_map(jnp.linalg.cholesky, jnp.linalg.cholesky, s, mesh=mesh,
                             in_specs=P(None, "x", "y"), out_specs=P(None, "x", "y"))
    assert report.name in ("unknown", "discrepancy"), report.render()


def test_cholesky_of_a_split_batch_is_equivalent() -> None:
    x = np.random.default_rng(1).standard_normal((4, 8, 8)).astype(np.float32)
    s = np.asarray(_spd(jnp.asarray(x)))
    report = check_shard_map(jnp.linalg.cholesky, jnp.linalg.cholesky, s, mesh=_mesh(2),
                             in_specs=P("x"), out_specs=P("x"))
    assert report.name == "equivalent", report.render()


def _bits(k: jax.Array) -> jax.Array:
    return jax.random.bits(jax.random.wrap_key_data(k, impl="rbg"), (4, 3))


def test_bits_from_per_device_keys() -> None:
    """Each device draws from its own key (the key data split over "x"): the reference that draws from
    each half of the keys is proven; one that swaps the halves is not."""
    keys = np.arange(8, dtype=np.uint32)  # two rbg keys, one per device

    def ref(k: jax.Array) -> jax.Array:
        return jnp.concatenate([_bits(k[:4]), _bits(k[4:])])

    def swapped(k: jax.Array) -> jax.Array:
        return jnp.concatenate([_bits(k[4:]), _bits(k[:4])])

    report = check_shard_map(ref, _bits, keys, mesh=_mesh(2), in_specs=P("x"), out_specs=P("x"))
    assert report.name == "equivalent", report.render()
    report = check_shard_map(swapped, _bits, keys, mesh=_mesh(2), in_specs=P("x"), out_specs=P("x"))
    assert report.name == "discrepancy", report.render()
