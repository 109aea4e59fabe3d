// Mixture-of-experts MLP with expert parallelism: top-k gating, a capacity per expert, a load-balancing loss, and
// tokens dispatched to the experts' ranks and combined back with all-to-allv.
//
// Experts are split in blocks over the ranks of the expert communicator (n_experts / nranks each); the router
// [d, E] is an ordinary dense parameter (it lives in its block's FSDP unit). For each local token row h [d]:
//   probs = softmax(h @ router)                                       [E]
//   the top_k experts by probability are its choices, gate = probs[e] (not renormalised)
//   y = sum over kept choices e of gate_e * Expert_e(h),  Expert_e(h) = gelu(h @ w1_e) @ w2_e,  w1 [d, de], w2 [de, d]
//
// Capacity and the load-balancing loss are per sequence (a GShard "group"): in a sequence of T tokens each expert
// takes at most C = ceil(capacity_factor * top_k * T / E) tokens, first choices of every token before second
// choices, earlier tokens first; a choice beyond capacity is dropped (the token keeps its residual). With
//   f_e = share of the sequence's top_k choices that name e (before dropping),  P_e = mean over its tokens of probs[e]
// the sequence's loss is aux = E * sum_e f_e * P_e (Switch Transformer, Fedus et al. 2021), minimised by uniform
// routing; f is a constant to the gradient. Because every decision depends on one sequence only, the layer
// computes the same function however whole sequences are spread over ranks, which is what makes the distributed
// layer comparable with the same layer in one process.
#pragma once

#include <chorus/chorus.hpp>

#include <cstdint>
#include <vector>

#include "trainer/model.h"

namespace trainer {

struct CommStats;

struct MoeConfig {
  int d_model = 0, d_expert = 0, n_experts = 0, top_k = 1, seq_len = 0;
  float capacity_factor = 1.25f;
  int capacity() const;  // C above
};

class MoeLayer {
 public:
  // ep: the expert-parallel communicator (null: every expert in this process). stats: where the layer's
  // all-to-alls are counted (may be null). Expert e's weights are initialised from (seed, layer, e) alone, so they are
  // the same wherever e lives. w1 is drawn with std_w1, w2 with std_w2.
  MoeLayer(const MoeConfig& c, int layer, uint64_t seed, float std_w1, float std_w2, chorus::Comm* ep,
           CommStats* stats);

  // h: [nseq * T, d] (whole sequences), router: [d, E]. Overwrites y [nseq * T, d]. Returns the sum over the nseq
  // sequences of aux. Keeps what the backward needs.
  double forward(const float* router, const float* h, float* y, int nseq);
  // dy: [n, d], the gradient of y. Adds the gradient of h to dh [n, d] and of the router to drouter [d, E]; writes
  // the local experts' gradients (grads()). aux_scale: the weight of each sequence's aux in the loss.
  void backward(const float* router, const float* h, const float* dy, float aux_scale, float* dh, float* drouter);

  int first_expert() const { return first_; }
  int local_experts() const { return local_; }
  // Local experts' weights, expert after expert, each w1 [d, de] then w2 [de, d]; gradients and AdamW moments alike.
  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  std::vector<Segment> segments();
  size_t expert_numel() const { return 2 * size_t(c_.d_model) * c_.d_expert; }

  // Which expert each kept (token, choice) went to, in dispatch order; for tests and statistics.
  struct Route {
    int token;
    int expert;
    float gate;
  };
  const std::vector<Route>& routes() const { return routes_; }

 private:
  // Sends rows to the expert ranks: send holds rows for rank j in block j (send_rows[j] rows); recv gets rank i's rows
  // in block i (recv_rows[i] rows). A copy in one process.
  void exchange(const std::vector<float>& send, const std::vector<size_t>& send_rows, std::vector<float>& recv,
                const std::vector<size_t>& recv_rows);
  // Moves rows between the receive layout (by source rank, then local expert) and the expert layout (by local expert,
  // then source rank), so each expert's rows are contiguous for its matrix products: receive -> expert when
  // to_experts, else back.
  void relayout(const std::vector<float>& in, std::vector<float>& out, bool to_experts) const;

  MoeConfig c_;
  chorus::Comm* ep_;
  CommStats* stats_;
  int nranks_ = 1, first_ = 0, local_ = 0;
  std::vector<float> params_, grads_, m_, v_;

  // Saved by the forward for the backward.
  int n_ = 0;                  // local token rows
  std::vector<float> probs_;   // [n, E]
  std::vector<float> frac_;    // [nseq, E]: f_e of each sequence
  std::vector<Route> routes_;  // kept choices, sorted by (expert, token): dispatch order, grouped by rank
  std::vector<size_t> send_rows_, recv_rows_;  // rows per destination / source rank
  std::vector<size_t> from_rows_;              // [source rank, local expert]: rows received
  std::vector<float> xe_, ue_, ae_;            // expert layout: inputs [M, d], pre-activations and activations [M, de]
  std::vector<float> out_;                     // [routes, d]: each route's expert output, back in dispatch order
  std::vector<float> sendbuf_, recvbuf_, ye_;  // staging
};

}  // namespace trainer
