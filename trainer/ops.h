// Compute kernels of the reference trainer: matrix products through BLAS and the hand-written forward and
// backward of RMSNorm, GELU, causal self-attention and softmax cross-entropy.
//
// Every matrix is row-major fp32. Shapes are written [rows, cols]; n is a number of token rows (sequences x
// seq_len), d the model width. Functions named *_backward that take a gradient output pointer say whether they
// overwrite it or add to it; adding is the rule wherever a tensor feeds more than one consumer (the residual
// stream, weight gradients accumulated over a batch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trainer {

// BLAS runs single-threaded: ranks (processes or threads) are the parallelism, and one thread per call keeps every
// product's summation order fixed, so a run is bitwise reproducible. Call once before any gemm.
void blas_init();

// C[M, N] = alpha * op(A) * op(B) + beta * C, where op(A) is [M, K] (A stored [K, M] when trans_a) and op(B) is
// [K, N] (B stored [N, K] when trans_b); lda, ldb, ldc are row strides in elements.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc);

// y = x / rms(x) * g per row, rms(x) = sqrt(mean(x^2) + eps). x, y: [n, d]; g: [d]; rinv: [n] (1 / rms, kept for
// the backward).
void rmsnorm_forward(const float* x, const float* g, float* y, float* rinv, int n, int d);
// Adds the input gradient to dx [n, d] and the gain gradient to dg [d].
void rmsnorm_backward(const float* x, const float* g, const float* rinv, const float* dy, float* dx, float* dg, int n,
                      int d);

// GELU, tanh approximation (Hendrycks and Gimpel, 2016). a = gelu(u), elementwise over count values.
void gelu_forward(const float* u, float* a, size_t count);
// du = da * gelu'(u) (overwrites du).
void gelu_backward(const float* u, const float* da, float* du, size_t count);

// Causal multi-head self-attention of nseq sequences of T tokens. qkv: [nseq * T, 3 * H * hd], each row q | k | v
// with head h at columns h * hd of each third. out: [nseq * T, H * hd] (overwritten). probs: [nseq, H, T, T], the
// softmax of each head (row i is zero beyond column i), kept for the backward.
void attention_forward(const float* qkv, float* out, float* probs, int nseq, int T, int H, int hd);
// dout: [nseq * T, H * hd]. Overwrites dqkv [nseq * T, 3 * H * hd]. scratch: T * T floats.
void attention_backward(const float* qkv, const float* probs, const float* dout, float* dqkv, float* scratch, int nseq,
                        int T, int H, int hd);

// Softmax cross-entropy of n rows of logits [n, V] against targets [n] (bytes). Returns the sum over rows of
// -log p(target), accumulated in double. Writes dlogits = (softmax - onehot) * grad_scale when dlogits is not null
// (may alias logits).
double cross_entropy(float* logits, const uint8_t* targets, float* dlogits, int n, int V, float grad_scale);

// Deterministic initialisation that does not depend on how a tensor is split: element i of the stream `key` is
// std * N(0, 1) computed from (key, i) alone, so a rank holding elements [first, first + count) of a tensor fills
// exactly what a single process would have put there.
void init_normal(float* out, size_t count, float std, uint64_t key, size_t first);
// Mixes values into a key for init_normal (and anything else that needs a stable 64-bit hash).
uint64_t mix64(uint64_t x);
uint64_t hash_combine(uint64_t seed, uint64_t v);
// FNV-1a (Fowler, Noll, Vo) of n bytes, continuing from h: the checksums of checkpoint files and the identities of
// texts (a model's description, the training settings, the corpus).
constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
uint64_t fnv1a(const void* p, size_t n, uint64_t h = kFnv1aBasis);
inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aBasis) { return fnv1a(s.data(), s.size(), h); }
// The shortest decimal text that reads back as v (std::to_chars): two values that differ print differently.
std::string shortest_text(float v);

}  // namespace trainer
