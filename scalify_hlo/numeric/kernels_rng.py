"""The NumPy kernel of `rng_bit_generator`: the exact bits and output state XLA's expander produces.

XLA expands the op (`xla/hlo/transforms/expanders/rng_bit_generator_expander.cc`) with the generators of
`xla/hlo/builder/lib/prng.cc`; the CPU and GPU compilers map `DEFAULT` to `PHILOX` (TPUs have a generator
of their own: `DEFAULT` bits here are those of XLA CPU, which is what the numeric checks run against). The
state is u64[n]: its first word is the key, the rest the counter.

- THREE_FRY (state u64[2]): Threefry-2x32 with 20 rounds, keyed by the key's two 32-bit halves, on the
  counter plus each element's row-major position. 32-bit (and narrower) outputs come from half as many
  blocks: the shape is halved along its first even dim (else its largest), the two output words of each
  block are placed side by side along a new unit dim after it, and narrower types keep the low bits.
  64-bit outputs join a block's two words (low, high). The counter advances by the blocks used.
- PHILOX (state u64[2] or u64[3]): Philox-4x32 with 10 rounds on a 128-bit counter (u64[2]: the state's
  words reversed, so the key is also the counter's high word; u64[3]: words 1 and 2) plus the block
  index; the four words of each block are consecutive outputs (64-bit outputs join words 0,1 and 2,3).
  The low counter word (u64[3]: both) advances by the blocks used.

Any other algorithm, state size or element type (JAX asks for unsigned bits only) has no kernel (NumericUnsupported): a guessed stream
could back a false discrepancy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.nodes import Op, TensorType
from scalify_hlo.numeric.values import NumericUnsupported, Val, as_array, np_dtype

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine

U32 = np.uint32
U64 = np.uint64
_M32 = U64(0xFFFFFFFF)

# ------------------------------------------------------------------------------------------ ThreeFry

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _rotl(v: np.ndarray, d: int) -> np.ndarray:
    return (v << U32(d)) | (v >> U32(32 - d))


def threefry2x32(x0: np.ndarray, x1: np.ndarray, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32, 20 rounds (prng.cc's ThreeFry2x32), on u32 arrays with a u32 key pair."""
    ks = (U32(k0), U32(k1), U32(0x1BD11BDA ^ k0 ^ k1))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for block in range(5):
        for r in _ROTATIONS[4 * (block % 2): 4 * (block % 2) + 4]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + U32(block + 1)
    return x0, x1


def _split_halves(shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """prng.cc's SplitShapeIntoHalves: the split dim and the half shape (scalars: dim 0 of shape [1])."""
    if not shape:
        return 0, (1,)
    even = [i for i, n in enumerate(shape) if n % 2 == 0]
    dim = even[0] if even else max(range(len(shape)), key=lambda i: (shape[i], -i))
    return dim, tuple(-(-n // 2) if i == dim else n for i, n in enumerate(shape))


def _threefry_words(key: int, counter: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The two output words of blocks counter, counter + 1, ..., counter + n - 1 (wrapping in u64)."""
    with np.errstate(over="ignore"):
        inputs = U64(counter) + np.arange(n, dtype=U64)
        return threefry2x32((inputs & _M32).astype(U32), (inputs >> U64(32)).astype(U32),
                            key & 0xFFFFFFFF, key >> 32)


def threefry_bits(key: int, counter: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[np.ndarray, int]:
    """(bits, new counter) of THREE_FRY for one state."""
    bits = dtype.itemsize * 8
    if bits == 64:
        n = math.prod(shape)
        lo, hi = _threefry_words(key, counter, n)
        out = lo.astype(U64) | (hi.astype(U64) << U64(32))
        return out.reshape(shape).view(dtype), (counter + n) % (1 << 64)
    dim, half = _split_halves(shape)
    n = math.prod(half)
    w0, w1 = _threefry_words(key, counter, n)
    pair = np.stack([w0.reshape(half), w1.reshape(half)], axis=dim + 1)  # [..., half_d, 2, ...]
    rounded = list(shape) if shape else [1]
    rounded[dim] = 2 * half[dim]
    words = pair.reshape(rounded)[tuple(slice(0, k) for k in (shape or (1,)))].reshape(shape)
    return words.astype(f"u{dtype.itemsize}").view(dtype), (counter + n) % (1 << 64)


# -------------------------------------------------------------------------------------------- Philox

_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_PHILOX_M = (U64(0xD2511F53), U64(0xCD9E8D57))


def philox4x32(x: list[np.ndarray], k0: int, k1: int) -> list[np.ndarray]:
    """Philox-4x32, 10 rounds (prng.cc's Philox4x32), on four u32 arrays with a u32 key pair."""
    for _ in range(10):
        p0 = x[0].astype(U64) * _PHILOX_M[0]
        p1 = x[2].astype(U64) * _PHILOX_M[1]
        x = [(p1 >> U64(32)).astype(U32) ^ x[1] ^ U32(k0), (p1 & _M32).astype(U32),
             (p0 >> U64(32)).astype(U32) ^ x[3] ^ U32(k1), (p0 & _M32).astype(U32)]
        k0, k1 = (k0 + _PHILOX_W[0]) & 0xFFFFFFFF, (k1 + _PHILOX_W[1]) & 0xFFFFFFFF
    return x


def philox_bits(key: int, low: int, high: int, shape: tuple[int, ...], dtype: np.dtype[Any]
                ) -> tuple[np.ndarray, int, int]:
    """(bits, new low counter word, new high counter word) of PHILOX for one key and 128-bit counter."""
    size = math.prod(shape)
    words_per = 2 if dtype.itemsize == 8 else 1
    blocks = -(-size * words_per // 4)
    with np.errstate(over="ignore"):
        lo = U64(low) + np.arange(blocks, dtype=U64)
        hi = np.where(lo < U64(low), U64(high) + U64(1), U64(high))  # the carry, as prng.cc's Uint128AddUint64
    words = philox4x32([(lo & _M32).astype(U32), (lo >> U64(32)).astype(U32), (hi & _M32).astype(U32),
                        (hi >> U64(32)).astype(U32)], key & 0xFFFFFFFF, key >> 32)
    if words_per == 2:
        pairs = [w.astype(U64) for w in words]
        flat = np.stack([pairs[0] | (pairs[1] << U64(32)), pairs[2] | (pairs[3] << U64(32))], axis=1).reshape(-1)
        out = flat[:size].reshape(shape).view(dtype)
    else:
        flat = np.stack(words, axis=1).reshape(-1)
        out = flat[:size].reshape(shape).astype(f"u{dtype.itemsize}").view(dtype)
    new_low = (low + blocks) % (1 << 64)
    new_high = (high + (new_low < low)) % (1 << 64)
    return out, new_low, new_high


# ---------------------------------------------------------------------------------------------- kernel

_DEFAULT = "PHILOX"  # XLA CPU's and GPU's RngBitGeneratorExpander(RNG_PHILOX)


def bits_type(op: Op) -> TensorType:
    return op.results[1].tensor


def rng_bit_generator(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """(output state, bits) per device, from each device's state."""
    state = as_array(args[0])
    out = bits_type(op)
    algorithm = str(op.attrs.get("rng_algorithm", "DEFAULT"))
    algorithm = _DEFAULT if algorithm == "DEFAULT" else algorithm
    dtype = np_dtype(out.dtype)
    if state.dtype != U64 or dtype.kind != "u" or dtype.itemsize not in (1, 2, 4, 8):
        raise NumericUnsupported(op, f"rng_bit_generator of {out.dtype} bits from a {state.dtype} state")
    words = state.shape[1] if state.ndim == 2 else 0
    if not (algorithm == "THREE_FRY" and words == 2) and not (algorithm == "PHILOX" and words in (2, 3)):
        raise NumericUnsupported(op, f"rng_bit_generator algorithm {algorithm} with a u64[{words}] state")
    states, values = [], []
    for s in state:
        key = int(s[0])
        if algorithm == "THREE_FRY":
            bits, counter = threefry_bits(key, int(s[1]), out.shape, dtype)
            states.append([key, counter])
        elif words == 2:  # the counter is the state reversed: (low, high) = (s[1], s[0] = the key)
            bits, low, _ = philox_bits(key, int(s[1]), key, out.shape, dtype)
            states.append([key, low])
        else:
            bits, low, high = philox_bits(key, int(s[1]), int(s[2]), out.shape, dtype)
            states.append([key, low, high])
        values.append(bits)
    return [np.array(states, dtype=U64), np.stack(values).reshape((len(values), *out.shape))]
