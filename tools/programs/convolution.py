"""Convolutions (issue 14, op coverage): `lax.conv_general_dilated`, what flax `nn.Conv` lowers to.

- ``conv_net``: a small NHWC conv net (3x3 conv, relu, strided 3x3 conv), partitioned by XLA with the
  batch split (data parallelism) and, on a 2 x 4 mesh, the first conv's output features split over "tp"
  too (its second conv then contracts split features: a partial sum and an all-reduce);
- ``conv_train_loss_grad``: the kernels' gradients of a squared loss of ``conv_net``, batch split: the
  weight gradient is a convolution that contracts the batch (partial sums over "dp");
- shard_map bodies (one device's view) on a 2 x 4 mesh ("dp", "tp"): output features split over "tp";
  input features split over "tp" with a psum (and twins: no psum, psum over "dp"); a depthwise conv
  with the channels split over "tp";
- ``conv_same``: a 3x3 SAME conv partitioned by XLA with the height split over "tp": a halo exchange;
  ``patchify`` and ``pointwise`` (1x1) with the height split: every window inside a block, no exchange;
  and a shard_map body convolving its own rows of a height-split image without its neighbours' rows.
- halo exchanges elsewhere (rules/halo.py): a strided conv with height and width split; the input and
  kernel gradients of a height-split conv (the kernel gradient sums every device's rows); max and average
  pooling; a shard_map body that exchanges its halo rows itself with `ppermute` (and a twin sending them
  the wrong way); and the gradient of a max pool, which XLA's partitioner (jax 0.10.2 and 0.12, CPU,
  Shardy and GSPMD alike) computes wrong on the first block of rows: a discrepancy that is XLA's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

MESH_2D = (2, 4)
NHWC = ("NHWC", "HWIO", "NHWC")


def conv(x: jax.Array, w: jax.Array, stride: int = 1, groups: int = 1) -> jax.Array:
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=NHWC,
                                    feature_group_count=groups)


def conv_net(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = jax.nn.relu(conv(x, w1))
    return conv(h, w2, stride=2)


def conv_train_loss_grad(x: jax.Array, w1: jax.Array, w2: jax.Array) -> tuple[jax.Array, jax.Array]:
    def loss(ws: tuple[jax.Array, jax.Array]) -> jax.Array:
        return jnp.mean(conv_net(x, *ws) ** 2)
    return jax.grad(loss)((w1, w2))


def conv_same(x: jax.Array, w: jax.Array) -> jax.Array:
    return conv(x, w)


def patchify(x: jax.Array, w: jax.Array) -> jax.Array:
    """A ViT-style patch embedding: a 2x2 window with stride 2, no padding (each window inside a block
    of an evenly split image)."""
    return lax.conv_general_dilated(x, w, (2, 2), "VALID", dimension_numbers=NHWC)


def pointwise(x: jax.Array, w: jax.Array) -> jax.Array:
    """A 1x1 convolution: a matmul over the channels at every pixel."""
    return lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=NHWC)


def depthwise_ref(x: jax.Array, w: jax.Array) -> jax.Array:
    return conv(x, w, groups=x.shape[-1])


# ------------------------------------------------------------------ shard_map bodies (one device's view)


def out_features_body(x: jax.Array, w: jax.Array) -> jax.Array:
    """x batch-split over "dp", w's output features over "tp": each device computes its features."""
    return conv(x, w)


def in_features_body(x: jax.Array, w: jax.Array) -> jax.Array:
    """x's channels and w's input features split over "tp": partial sums, summed over "tp"."""
    return lax.psum(conv(x, w), "tp")


def in_features_missing_psum_body(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # BUG: no psum over "tp"


def in_features_psum_wrong_axis_body(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.psum(conv(x, w), "dp")  # BUG: psum over "dp" where the partial sums live on "tp"


def depthwise_body(x: jax.Array, w: jax.Array) -> jax.Array:
    """A depthwise conv with the channels split over "tp": each device convolves its own channels."""
    return conv(x, w, groups=x.shape[-1])


def depthwise_shifted_body(x: jax.Array, w: jax.Array) -> jax.Array:
    y = conv(x, w, groups=x.shape[-1])
    return jnp.roll(y, 1, axis=-1)  # BUG: the output channels rotated by one


def spatial_no_halo_body(x: jax.Array, w: jax.Array) -> jax.Array:
    """The image height split over "tp", each device convolving its own rows."""
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)  # BUG: no halo rows


def conv_strided(x: jax.Array, w: jax.Array) -> jax.Array:
    return conv(x, w, stride=2)


def conv_same_grads(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The input and kernel gradients of a squared loss of a 3x3 SAME conv."""
    return jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))(x, w)


def max_pool(x: jax.Array) -> jax.Array:
    """A ResNet stem's max pool: 3x3 windows, stride 2, SAME."""
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def avg_pool(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME") / 9.0


def max_pool_grad(x: jax.Array) -> jax.Array:
    def pool(v: jax.Array) -> jax.Array:
        return lax.reduce_window(v, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), "SAME")  # BUG: XLA's, in this pool's gradient
    return jax.grad(lambda v: jnp.sum(pool(v) ** 2))(x)


def _shift(v: jax.Array, k: int, n: int) -> jax.Array:
    """Device i receives device (i - k)'s `v` along "tp"; the devices with no sender receive zeros."""
    return lax.ppermute(v, "tp", [(i, i + k) for i in range(n) if 0 <= i + k < n])


def halo_exchange_body(x: jax.Array, w: jax.Array) -> jax.Array:
    """The image height split over "tp": each device fetches the last row of the block above and the first
    of the block below (zeros past the image's edges) and convolves its rows VALID along the height."""
    n = lax.axis_size("tp")
    above, below = _shift(x[:, -1:], 1, n), _shift(x[:, :1], -1, n)
    rows = jnp.concatenate([above, x, below], axis=1)
    return lax.conv_general_dilated(rows, w, (1, 1), ((0, 0), (1, 1)), dimension_numbers=NHWC)


def halo_exchange_wrong_way_body(x: jax.Array, w: jax.Array) -> jax.Array:
    n = lax.axis_size("tp")
    above, below = _shift(x[:, -1:], -1, n), _shift(x[:, :1], 1, n)  # BUG: each halo row sent the wrong way
    rows = jnp.concatenate([above, x, below], axis=1)
    return lax.conv_general_dilated(rows, w, (1, 1), ((0, 0), (1, 1)), dimension_numbers=NHWC)
