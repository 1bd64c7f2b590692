// hadamard: the normalized Walsh–Hadamard rotation of attention heads (keys and queries before a quantized K cache).
#pragma once

namespace kvlm {

// The block the rotation works in: the largest power of two dividing head_dim (all of a
// head when head_dim is a power of two, e.g. 8, 64, 128; 32 for 96; 16 for 80).
int hadamard_block(int head_dim);

// Rotates x: [num_heads, head_dim] in place, each head by the block-diagonal matrix of
// normalized Walsh–Hadamard blocks H/sqrt(b), b = hadamard_block(head_dim). The matrix is
// orthogonal and symmetric, so (Hq)·(Hk) = q·k (attention is unchanged) and applying it twice
// gives x back. Why: a key with an outlier channel has its energy spread over the whole block,
// so a per-token scale (int8, int4 keys) no longer spends its range on one channel.
void hadamard_rotate_heads(float* x, int num_heads, int head_dim);

}  // namespace kvlm
