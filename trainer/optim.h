// AdamW (Loshchilov and Hutter, "Decoupled Weight Decay Regularization", 2019) with global-norm gradient clipping,
// over the segments of parameters a rank owns (its FSDP shards and its experts). Every element's update depends on
// that element alone, which is why ZeRO can split the optimizer state exactly like the parameters.
#pragma once

#include <vector>

#include "trainer/model.h"

namespace trainer {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to segments with decay set
};

// Sum of squared gradients over the segments, in double.
double grad_sq(const std::vector<Segment>& segs);

// One step t (1-based) with learning rate lr; every gradient is multiplied by grad_mult first (the clipping factor).
//   m = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr * wd * p
void adamw_step(const std::vector<Segment>& segs, const AdamWConfig& c, float lr, int t, float grad_mult);

// Learning rate at step t (1-based): linear warm-up over `warmup` steps to lr, then cosine decay to min_lr at `steps`.
float lr_at(int t, int steps, int warmup, float lr, float min_lr);

}  // namespace trainer
