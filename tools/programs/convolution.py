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
