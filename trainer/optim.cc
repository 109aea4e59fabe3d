#include "trainer/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace trainer {

double grad_sq(const std::vector<Segment>& segs) {
  double s = 0;
  for (const Segment& seg : segs)
    for (size_t i = 0; i < seg.n; ++i) s += double(seg.grad[i]) * seg.grad[i];
  return s;
}

void adamw_step(const std::vector<Segment>& segs, const AdamWConfig& c, float lr, int t, float grad_mult) {
  const float bc1 = 1.f - std::pow(c.beta1, float(t)), bc2 = 1.f - std::pow(c.beta2, float(t));
  for (const Segment& seg : segs) {
    const float decay = seg.decay ? lr * c.weight_decay : 0.f;
    for (size_t i = 0; i < seg.n; ++i) {
      const float g = seg.grad[i] * grad_mult;
      float& m = seg.m[i];
      float& v = seg.v[i];
      m = c.beta1 * m + (1.f - c.beta1) * g;
      v = c.beta2 * v + (1.f - c.beta2) * g * g;
      seg.param[i] -= lr * (m / bc1) / (std::sqrt(v / bc2) + c.eps) + decay * seg.param[i];
    }
  }
}

float lr_at(int t, int steps, int warmup, float lr, float min_lr) {
  if (warmup > 0 && t <= warmup) return lr * float(t) / float(warmup);
  const float span = float(std::max(1, steps - warmup));
  const float progress = std::min(1.f, float(t - warmup) / span);
  return min_lr + 0.5f * (lr - min_lr) * (1.f + std::cos(std::numbers::pi_v<float> * progress));
}

}  // namespace trainer
