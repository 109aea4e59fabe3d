#include "trainer/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "trainer/dist.h"
#include "trainer/ops.h"

namespace trainer {

int MoeConfig::capacity() const {
  return static_cast<int>(std::ceil(double(capacity_factor) * top_k * seq_len / n_experts));
}

MoeLayer::MoeLayer(const MoeConfig& c, int layer, uint64_t seed, float std_w1, float std_w2, chorus::Comm* ep,
                   CommStats* stats)
    : c_(c), ep_(ep), stats_(stats) {
  nranks_ = ep ? ep->size() : 1;
  if (c.n_experts % nranks_ != 0)
    throw std::invalid_argument(std::to_string(c.n_experts) + " experts do not divide over " + std::to_string(nranks_) +
                                " ranks (expert parallelism needs a multiple of the ranks)");
  local_ = c.n_experts / nranks_;
  first_ = (ep ? ep->rank() : 0) * local_;
  const size_t w1 = size_t(c.d_model) * c.d_expert, en = expert_numel();
  params_.resize(local_ * en);
  grads_.assign(local_ * en, 0.f);
  m_.assign(local_ * en, 0.f);
  v_.assign(local_ * en, 0.f);
  for (int le = 0; le < local_; ++le) {
    const uint64_t key = hash_combine(hash_combine(hash_combine(seed, 0x6d6f65), layer), first_ + le);
    init_normal(&params_[le * en], w1, std_w1, hash_combine(key, 1), 0);
    init_normal(&params_[le * en + w1], w1, std_w2, hash_combine(key, 2), 0);
  }
}

std::vector<Segment> MoeLayer::segments() {
  return {Segment{params_.data(), grads_.data(), m_.data(), v_.data(), params_.size(), true}};
}

void MoeLayer::exchange(const std::vector<float>& send, const std::vector<size_t>& send_rows, std::vector<float>& recv,
                        const std::vector<size_t>& recv_rows) {
  const size_t d = c_.d_model;
  recv.resize(std::accumulate(recv_rows.begin(), recv_rows.end(), size_t{0}) * d);
  if (!ep_) {  // one rank: what it sends is what it receives
    std::copy(send.begin(), send.begin() + recv.size(), recv.begin());
    return;
  }
  std::vector<size_t> sc(nranks_), sd(nranks_), rc(nranks_), rd(nranks_);
  for (int j = 0; j < nranks_; ++j) {
    sc[j] = send_rows[j] * d;
    rc[j] = recv_rows[j] * d;
    sd[j] = j ? sd[j - 1] + sc[j - 1] : 0;
    rd[j] = j ? rd[j - 1] + rc[j - 1] : 0;
  }
  const size_t sent = sd.back() + sc.back();
  auto call = [&] {
    ep_->all_to_allv(std::span<const float>(send.data(), sent), std::span<const size_t>(sc),
                     std::span<const size_t>(sd), std::span<float>(recv), std::span<const size_t>(rc),
                     std::span<const size_t>(rd));
  };
  if (stats_)
    stats_->timed((sent + recv.size()) * sizeof(float), call);
  else
    call();
}

void MoeLayer::relayout(const std::vector<float>& in, std::vector<float>& out, bool to_experts) const {
  const size_t d = c_.d_model;
  out.resize(in.size());
  // Row offset of block (src, le) in the receive layout.
  std::vector<size_t> off(from_rows_.size());
  std::exclusive_scan(from_rows_.begin(), from_rows_.end(), off.begin(), size_t{0});
  size_t row = 0;  // in the expert layout
  for (int le = 0; le < local_; ++le)
    for (int src = 0; src < nranks_; ++src) {
      const size_t b = size_t(src) * local_ + le, bytes = from_rows_[b] * d * sizeof(float);
      if (bytes && to_experts) std::memcpy(&out[row * d], &in[off[b] * d], bytes);
      if (bytes && !to_experts) std::memcpy(&out[off[b] * d], &in[row * d], bytes);
      row += from_rows_[b];
    }
}

double MoeLayer::forward(const float* router, const float* h, float* y, int nseq) {
  const int d = c_.d_model, E = c_.n_experts, T = c_.seq_len, K = c_.top_k, de = c_.d_expert;
  const int n = n_ = nseq * T;
  const int C = c_.capacity();

  // Router probabilities [n, E].
  probs_.resize(size_t(n) * E);
  gemm(false, false, n, E, d, 1.f, h, d, router, E, 0.f, probs_.data(), E);
  for (int i = 0; i < n; ++i) {
    float* p = &probs_[size_t(i) * E];
    const float mx = *std::max_element(p, p + E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += p[e] = std::exp(p[e] - mx);
    for (int e = 0; e < E; ++e) p[e] /= sum;
  }

  // Top-k choices per token: highest probability first, the lower expert index on a tie.
  std::vector<int> choice(size_t(n) * K);
  for (int i = 0; i < n; ++i) {
    const float* p = &probs_[size_t(i) * E];
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        if (std::find(&choice[size_t(i) * K], &choice[size_t(i) * K + k], e) != &choice[size_t(i) * K + k]) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      choice[size_t(i) * K + k] = best;
    }
  }

  // Capacity and the load-balancing loss, sequence by sequence.
  routes_.clear();
  frac_.assign(size_t(nseq) * E, 0.f);
  double aux = 0;
  std::vector<int> taken(E);
  for (int s = 0; s < nseq; ++s) {
    std::fill(taken.begin(), taken.end(), 0);
    float* f = &frac_[size_t(s) * E];
    for (int k = 0; k < K; ++k)
      for (int t = 0; t < T; ++t) {
        const int i = s * T + t, e = choice[size_t(i) * K + k];
        f[e] += 1.f;
        if (taken[e] < C) {
          ++taken[e];
          routes_.push_back({i, e, probs_[size_t(i) * E + e]});
        }
      }
    double seq_aux = 0;
    for (int e = 0; e < E; ++e) {
      f[e] /= float(K * T);
      double pe = 0;
      for (int t = 0; t < T; ++t) pe += probs_[size_t(s * T + t) * E + e];
      seq_aux += double(f[e]) * pe / T;
    }
    aux += E * seq_aux;
  }
  // Dispatch order: by expert (hence by the expert's rank), then by token.
  std::sort(routes_.begin(), routes_.end(), [](const Route& a, const Route& b) {
    return a.expert != b.expert ? a.expert < b.expert : a.token < b.token;
  });

  // Tell every expert rank how many rows it gets for each of its experts: counts[j * local + le].
  std::vector<uint64_t> counts(size_t(nranks_) * local_, 0), from(counts.size());
  for (const Route& r : routes_) ++counts[r.expert];
  if (ep_) {
    auto call = [&] { ep_->all_to_all(std::span<const uint64_t>(counts), std::span<uint64_t>(from)); };
    if (stats_)
      stats_->timed(2 * counts.size() * sizeof(uint64_t), call);
    else
      call();
  } else {
    from = counts;
  }
  from_rows_.assign(from.begin(), from.end());
  send_rows_.assign(nranks_, 0);
  recv_rows_.assign(nranks_, 0);
  for (int j = 0; j < nranks_; ++j)
    for (int le = 0; le < local_; ++le) {
      send_rows_[j] += counts[size_t(j) * local_ + le];
      recv_rows_[j] += from_rows_[size_t(j) * local_ + le];
    }

  // Dispatch: each kept choice's token row to its expert.
  sendbuf_.resize(routes_.size() * d);
  for (size_t a = 0; a < routes_.size(); ++a)
    std::memcpy(&sendbuf_[a * d], h + size_t(routes_[a].token) * d, d * sizeof(float));
  exchange(sendbuf_, send_rows_, recvbuf_, recv_rows_);
  relayout(recvbuf_, xe_, true);

  // Experts: each runs on its contiguous rows.
  const size_t M = xe_.size() / d, en = expert_numel(), w1n = size_t(d) * de;
  ue_.resize(M * de);
  ae_.resize(M * de);
  ye_.resize(M * d);
  size_t row = 0;
  for (int le = 0; le < local_; ++le) {
    size_t m = 0;
    for (int src = 0; src < nranks_; ++src) m += from_rows_[size_t(src) * local_ + le];
    const float* w1 = &params_[le * en];
    const float* w2 = w1 + w1n;
    gemm(false, false, int(m), de, d, 1.f, xe_.data() + row * d, d, w1, de, 0.f, ue_.data() + row * de, de);
    gelu_forward(ue_.data() + row * de, ae_.data() + row * de, m * de);
    gemm(false, false, int(m), d, de, 1.f, ae_.data() + row * de, de, w2, d, 0.f, ye_.data() + row * d, d);
    row += m;
  }

  // Combine: outputs come back in dispatch order; each token sums its gated expert outputs.
  relayout(ye_, recvbuf_, false);
  exchange(recvbuf_, recv_rows_, out_, send_rows_);
  std::fill(y, y + size_t(n) * d, 0.f);
  for (size_t a = 0; a < routes_.size(); ++a) {
    float* yr = y + size_t(routes_[a].token) * d;
    const float* o = &out_[a * d];
    for (int j = 0; j < d; ++j) yr[j] += routes_[a].gate * o[j];
  }
  return aux;
}

void MoeLayer::backward(const float* router, const float* h, const float* dy, float aux_scale, float* dh,
                        float* drouter) {
  const int d = c_.d_model, E = c_.n_experts, T = c_.seq_len, de = c_.d_expert, n = n_;
  const size_t R = routes_.size();

  // Through the combine: d gate = dy . output, d output = gate * dy, sent back to the experts.
  std::vector<float> dgate(R);
  sendbuf_.resize(R * d);
  for (size_t a = 0; a < R; ++a) {
    const float* dyr = dy + size_t(routes_[a].token) * d;
    const float* o = &out_[a * d];
    float dot = 0;
    for (int j = 0; j < d; ++j) dot += dyr[j] * o[j];
    dgate[a] = dot;
    for (int j = 0; j < d; ++j) sendbuf_[a * d + j] = routes_[a].gate * dyr[j];
  }
  exchange(sendbuf_, send_rows_, recvbuf_, recv_rows_);
  relayout(recvbuf_, ye_, true);  // ye_ now holds d output [M, d]

  // Experts: dA = dY w2^T, dw2 = A^T dY, dU = gelu'(U) dA, dw1 = X^T dU, dX = dU w1^T.
  const size_t M = xe_.size() / d, en = expert_numel(), w1n = size_t(d) * de;
  std::vector<float> dU(M * de), dX(M * d);
  size_t row = 0;
  for (int le = 0; le < local_; ++le) {
    size_t m = 0;
    for (int src = 0; src < nranks_; ++src) m += from_rows_[size_t(src) * local_ + le];
    const float* w1 = &params_[le * en];
    const float* w2 = w1 + w1n;
    float* g1 = &grads_[le * en];
    float* g2 = g1 + w1n;
    float* du = dU.data() + row * de;
    gemm(false, true, int(m), de, d, 1.f, ye_.data() + row * d, d, w2, d, 0.f, du, de);
    gemm(true, false, de, d, int(m), 1.f, ae_.data() + row * de, de, ye_.data() + row * d, d, 0.f, g2, d);
    gelu_backward(ue_.data() + row * de, du, du, m * de);
    gemm(true, false, d, de, int(m), 1.f, xe_.data() + row * d, d, du, de, 0.f, g1, de);
    gemm(false, true, int(m), d, de, 1.f, du, de, w1, de, 0.f, dX.data() + row * d, d);
    row += m;
  }
  relayout(dX, recvbuf_, false);
  exchange(recvbuf_, recv_rows_, sendbuf_, send_rows_);
  for (size_t a = 0; a < R; ++a) {
    float* dhr = dh + size_t(routes_[a].token) * d;
    for (int j = 0; j < d; ++j) dhr[j] += sendbuf_[a * d + j];
  }

  // Router: d probs from the gates and from aux (d aux_s / d probs[t][e] = E f_e / T), then through the softmax.
  std::vector<float> dlogits(size_t(n) * E, 0.f);
  for (size_t a = 0; a < R; ++a) dlogits[size_t(routes_[a].token) * E + routes_[a].expert] += dgate[a];
  for (int i = 0; i < n; ++i) {
    const float* f = &frac_[size_t(i / T) * E];
    const float* p = &probs_[size_t(i) * E];
    float* g = &dlogits[size_t(i) * E];
    float dot = 0;
    for (int e = 0; e < E; ++e) {
      g[e] += aux_scale * E * f[e] / T;
      dot += p[e] * g[e];
    }
    for (int e = 0; e < E; ++e) g[e] = p[e] * (g[e] - dot);
  }
  gemm(true, false, d, E, n, 1.f, h, d, dlogits.data(), E, 1.f, drouter, E);
  gemm(false, true, n, d, E, 1.f, dlogits.data(), E, router, E, 1.f, dh, d);
}

}  // namespace trainer
