#include "trainer/ops.h"

#include <cblas.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numbers>

namespace trainer {

void blas_init() { openblas_set_num_threads(1); }

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS would leave C untouched only for beta == 1
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) C[size_t(i) * ldc + j] = beta == 0 ? 0.f : beta * C[size_t(i) * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

namespace {
constexpr float kNormEps = 1e-5f;
}

void rmsnorm_forward(const float* x, const float* g, float* y, float* rinv, int n, int d) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * d;
    float* yi = y + size_t(i) * d;
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += double(xi[j]) * xi[j];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + kNormEps));
    rinv[i] = r;
    for (int j = 0; j < d; ++j) yi[j] = xi[j] * r * g[j];
  }
}

// With y_j = g_j x_j r and r = (mean(x^2) + eps)^(-1/2):
//   dx_k = r g_k dy_k - (r^3 / d) x_k sum_j(dy_j g_j x_j),   dg_j = sum over rows of dy_j x_j r.
void rmsnorm_backward(const float* x, const float* g, const float* rinv, const float* dy, float* dx, float* dg, int n,
                      int d) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * d;
    const float* dyi = dy + size_t(i) * d;
    float* dxi = dx + size_t(i) * d;
    const float r = rinv[i];
    double dot = 0;
    for (int j = 0; j < d; ++j) dot += double(dyi[j]) * g[j] * xi[j];
    const float c = static_cast<float>(dot) * r * r * r / d;
    for (int j = 0; j < d; ++j) {
      dxi[j] += r * g[j] * dyi[j] - c * xi[j];
      dg[j] += dyi[j] * xi[j] * r;
    }
  }
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void gelu_forward(const float* u, float* a, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float x = u[i];
    a[i] = 0.5f * x * (1.f + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
  }
}

void gelu_backward(const float* u, const float* da, float* du, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float x = u[i];
    const float t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
    const float dt = (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * x * x);
    du[i] = da[i] * (0.5f * (1.f + t) + 0.5f * x * dt);
  }
}

// Per sequence b and head h, with q, k, v the [T, hd] column blocks of qkv (row stride 3 * H * hd):
//   S = q k^T / sqrt(hd), causal mask, P = softmax(S) by rows, O = P v.
void attention_forward(const float* qkv, float* out, float* probs, int nseq, int T, int H, int hd) {
  const int d = H * hd, ld = 3 * d;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (int b = 0; b < nseq; ++b)
    for (int h = 0; h < H; ++h) {
      const float* q = qkv + size_t(b) * T * ld + h * hd;
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* P = probs + (size_t(b) * H + h) * T * T;
      gemm(false, true, T, T, hd, scale, q, ld, k, ld, 0.f, P, T);  // P = S for now
      for (int i = 0; i < T; ++i) {
        float* row = P + size_t(i) * T;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (int j = 0; j <= i; ++j) sum += row[j] = std::exp(row[j] - mx);
        const float inv = 1.f / sum;
        for (int j = 0; j <= i; ++j) row[j] *= inv;
        for (int j = i + 1; j < T; ++j) row[j] = 0.f;
      }
      gemm(false, false, T, hd, T, 1.f, P, T, v, ld, 0.f, out + size_t(b) * T * d + h * hd, d);
    }
}

// dP = dO v^T, dv = P^T dO, dS = P * (dP - rowsum(P * dP)), dq = dS k / sqrt(hd), dk = dS^T q / sqrt(hd).
void attention_backward(const float* qkv, const float* probs, const float* dout, float* dqkv, float* scratch, int nseq,
                        int T, int H, int hd) {
  const int d = H * hd, ld = 3 * d;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  for (int b = 0; b < nseq; ++b)
    for (int h = 0; h < H; ++h) {
      const float* q = qkv + size_t(b) * T * ld + h * hd;
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* dq = dqkv + size_t(b) * T * ld + h * hd;
      float* dk = dq + d;
      float* dv = dq + 2 * d;
      const float* P = probs + (size_t(b) * H + h) * T * T;
      const float* dO = dout + size_t(b) * T * d + h * hd;
      float* dS = scratch;
      gemm(false, true, T, T, hd, 1.f, dO, d, v, ld, 0.f, dS, T);  // dS = dP for now
      gemm(true, false, T, hd, T, 1.f, P, T, dO, d, 0.f, dv, ld);
      for (int i = 0; i < T; ++i) {
        const float* p = P + size_t(i) * T;
        float* row = dS + size_t(i) * T;
        float dot = 0;
        for (int j = 0; j <= i; ++j) dot += p[j] * row[j];
        for (int j = 0; j <= i; ++j) row[j] = p[j] * (row[j] - dot);
        for (int j = i + 1; j < T; ++j) row[j] = 0.f;
      }
      gemm(false, false, T, hd, T, scale, dS, T, k, ld, 0.f, dq, ld);
      gemm(true, false, T, hd, T, scale, dS, T, q, ld, 0.f, dk, ld);
    }
}

double cross_entropy(float* logits, const uint8_t* targets, float* dlogits, int n, int V, float grad_scale) {
  double total = 0;
  for (int i = 0; i < n; ++i) {
    float* row = logits + size_t(i) * V;
    float mx = row[0];
    for (int j = 1; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
    const double logz = mx + std::log(sum);
    total += logz - row[targets[i]];
    if (dlogits) {
      float* drow = dlogits + size_t(i) * V;
      for (int j = 0; j < V; ++j) drow[j] = static_cast<float>(std::exp(double(row[j]) - logz)) * grad_scale;
      drow[targets[i]] -= grad_scale;
    }
  }
  return total;
}

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_combine(uint64_t seed, uint64_t v) { return mix64(seed ^ mix64(v)); }

uint64_t fnv1a(const void* p, size_t n, uint64_t h) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

std::string shortest_text(float v) {
  char b[32];
  return std::string(b, std::to_chars(b, b + sizeof(b), v).ptr);
}

void init_normal(float* out, size_t count, float std, uint64_t key, size_t first) {
  for (size_t i = 0; i < count; ++i) {
    // Box-Muller from two 32-bit uniforms of one 64-bit hash.
    const uint64_t h = mix64(key ^ mix64(first + i));
    const double u1 = (double((h >> 32) & 0xffffffffu) + 1.0) / 4294967297.0;  // (0, 1)
    const double u2 = double(h & 0xffffffffu) / 4294967296.0;                  // [0, 1)
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    out[i] = static_cast<float>(std * z);
  }
}

}  // namespace trainer
