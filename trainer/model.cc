#include "trainer/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "trainer/dist.h"
#include "trainer/moe.h"
#include "trainer/ops.h"

namespace trainer {

std::string ModelConfig::describe() const {
  std::ostringstream s;
  s << "vocab=" << vocab << " seq_len=" << seq_len << " d_model=" << d_model << " layers=" << n_layers
    << " heads=" << n_heads << " d_ff=" << d_ff << " experts=" << n_experts;
  if (n_experts > 0) {
    // Exact: two factors that differ are two models (a stream's 6 digits made 1.25 and 1.2500001 one).
    s << " top_k=" << top_k << " capacity_factor=" << shortest_text(capacity_factor) << " d_expert=" << d_expert
      << " moe_every=" << moe_every;
  }
  return s.str();
}

uint64_t ModelConfig::hash() const { return fnv1a(describe()); }

void ModelConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  need(vocab == 256, "vocab must be 256 (the model reads bytes)");
  need(seq_len >= 2, "--seq-len must be at least 2");
  need(d_model >= 1 && n_heads >= 1 && n_layers >= 1 && d_ff >= 1, "--d-model, --heads, --layers, --d-ff must be >= 1");
  need(d_model % n_heads == 0,
       "--d-model " + std::to_string(d_model) + " is not a multiple of --heads " + std::to_string(n_heads));
  need(n_experts >= 0, "--experts must be >= 0");
  if (n_experts > 0) {
    need(top_k >= 1 && top_k <= n_experts, "--top-k must be between 1 and --experts");
    need(capacity_factor > 0, "--capacity-factor must be positive");
    need(d_expert >= 1, "--d-expert must be >= 1");
    need(moe_every >= 1 && moe_every <= n_layers,
         "--moe-every must be between 1 and --layers (or no block would be an MoE block)");
  }
  need(init_std > 0, "init_std must be positive");
}

std::vector<Unit> make_layout(const ModelConfig& c) {
  const int d = c.d_model;
  const float std_out = c.init_std / std::sqrt(2.f * c.n_layers);  // residual projections (GPT-2)
  auto unit = [](std::string name, std::vector<Tensor> tensors) {
    Unit u{std::move(name), std::move(tensors), 0};
    for (Tensor& t : u.tensors) {
      t.offset = u.numel;
      u.numel += t.numel();
    }
    return u;
  };
  std::vector<Unit> units;
  units.push_back(
      unit("embed", {{"wte", 0, c.vocab, d, false, c.init_std}, {"wpe", 0, c.seq_len, d, false, c.init_std}}));
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<Tensor> t = {{"ln1", 0, 1, d, false, 0},
                             {"wqkv", 0, d, 3 * d, true, c.init_std},
                             {"wo", 0, d, d, true, std_out},
                             {"ln2", 0, 1, d, false, 0}};
    if (c.is_moe_block(l)) {
      t.push_back({"router", 0, d, c.n_experts, true, c.init_std});
    } else {
      t.push_back({"w1", 0, d, c.d_ff, true, c.init_std});
      t.push_back({"w2", 0, c.d_ff, d, true, std_out});
    }
    units.push_back(unit("block" + std::to_string(l), std::move(t)));
  }
  units.push_back(unit("head", {{"lnf", 0, 1, d, false, 0}, {"wout", 0, d, c.vocab, true, c.init_std}}));
  return units;
}

void init_unit(const ModelConfig& c, const Unit& unit, int u, uint64_t seed, float* out, size_t first, size_t count) {
  std::fill(out, out + count, 0.f);  // padding past the unit's end stays zero
  for (size_t i = 0; i < unit.tensors.size(); ++i) {
    const Tensor& t = unit.tensors[i];
    const size_t lo = std::max(first, t.offset), hi = std::min(first + count, t.offset + t.numel());
    if (lo >= hi) continue;
    float* dst = out + (lo - first);
    if (t.init_std == 0)
      std::fill(dst, dst + (hi - lo), 1.f);
    else
      init_normal(dst, hi - lo, t.init_std, hash_combine(hash_combine(seed, u), i), lo - t.offset);
  }
}

// Activations of one block, kept from its forward for its backward. Shapes with n = nseq * T tokens.
struct Model::Block {
  std::vector<float> h1, rinv1;  // RMSNorm(x): [n, d], [n]
  std::vector<float> qkv;        // [n, 3d]
  std::vector<float> probs;      // attention probabilities [nseq, H, T, T]
  std::vector<float> att;        // attention output before wo: [n, d]
  std::vector<float> x1;         // residual after attention: [n, d]
  std::vector<float> h2, rinv2;  // RMSNorm(x1): [n, d], [n]
  std::vector<float> u, a;       // dense MLP: pre-activation and GELU [n, d_ff]
  std::vector<float> y;          // MoE output [n, d]
};

Model::Model(const ModelConfig& c, int nseq, uint64_t seed, Dist* dist)
    : c_(c), units_(make_layout(c)), nseq_(nseq), n_(nseq * c.seq_len) {
  c.validate();
  const size_t n = n_, d = c.d_model;
  for (int l = 0; l < c.n_layers; ++l) {
    auto b = std::make_unique<Block>();
    b->h1.resize(n * d);
    b->rinv1.resize(n);
    b->qkv.resize(n * 3 * d);
    b->probs.resize(size_t(nseq) * c.n_heads * c.seq_len * c.seq_len);
    b->att.resize(n * d);
    b->x1.resize(n * d);
    b->h2.resize(n * d);
    b->rinv2.resize(n);
    if (c.is_moe_block(l)) {
      b->y.resize(n * d);
      MoeConfig mc{c.d_model, c.d_expert, c.n_experts, c.top_k, c.seq_len, c.capacity_factor};
      moe_.push_back(std::make_unique<MoeLayer>(mc, l, seed, c.init_std, c.init_std / std::sqrt(2.f * c.n_layers),
                                                dist ? dist->experts() : nullptr, dist ? &dist->stats : nullptr));
    } else {
      b->u.resize(n * c.d_ff);
      b->a.resize(n * c.d_ff);
      moe_.push_back(nullptr);
    }
    blocks_.push_back(std::move(b));
  }
  xs_.assign(c.n_layers + 1, std::vector<float>(n * d));
  hf_.resize(n * d);
  rinvf_.resize(n);
  logits_.resize(n * c.vocab);
  dx_.resize(n * d);
  dh_.resize(n * d);
  dqkv_.resize(n * 3 * d);
  dff_.resize(n * std::max(c.d_ff, 1));
  scratch_.resize(size_t(c.seq_len) * c.seq_len);
  inputs_.resize(n);
  targets_.resize(n);
}

Model::~Model() = default;

std::vector<MoeLayer*> Model::moe_layers() const {
  std::vector<MoeLayer*> out;
  for (const auto& m : moe_)
    if (m) out.push_back(m.get());
  return out;
}

// Tensor t of a unit's flat parameters (or gradients).
static const float* at(const float* base, const Unit& u, int t) { return base + u.tensors[t].offset; }
static float* at(float* base, const Unit& u, int t) { return base + u.tensors[t].offset; }

// Tensor order inside a block unit (make_layout): ln1, wqkv, wo, ln2, then w1, w2 (dense) or router (MoE).
enum { kLn1, kWqkv, kWo, kLn2, kW1, kW2, kRouter = kW1 };

void Model::block_forward(int l, const float* p) {
  Block& b = *blocks_[l];
  const Unit& u = units_[1 + l];
  const int n = n_, d = c_.d_model, f = c_.d_ff;
  const float* x = xs_[l].data();
  float* out = xs_[l + 1].data();
  rmsnorm_forward(x, at(p, u, kLn1), b.h1.data(), b.rinv1.data(), n, d);
  gemm(false, false, n, 3 * d, d, 1.f, b.h1.data(), d, at(p, u, kWqkv), 3 * d, 0.f, b.qkv.data(), 3 * d);
  attention_forward(b.qkv.data(), b.att.data(), b.probs.data(), nseq_, c_.seq_len, c_.n_heads, c_.head_dim());
  std::copy(x, x + size_t(n) * d, b.x1.begin());  // x1 = x + att @ wo
  gemm(false, false, n, d, d, 1.f, b.att.data(), d, at(p, u, kWo), d, 1.f, b.x1.data(), d);
  rmsnorm_forward(b.x1.data(), at(p, u, kLn2), b.h2.data(), b.rinv2.data(), n, d);
  std::copy(b.x1.begin(), b.x1.end(), out);  // out = x1 + mlp(h2)
  if (moe_[l]) {
    aux_sum_ += moe_[l]->forward(at(p, u, kRouter), b.h2.data(), b.y.data(), nseq_);
    for (size_t i = 0; i < b.y.size(); ++i) out[i] += b.y[i];
  } else {
    gemm(false, false, n, f, d, 1.f, b.h2.data(), d, at(p, u, kW1), f, 0.f, b.u.data(), f);
    gelu_forward(b.u.data(), b.a.data(), b.u.size());
    gemm(false, false, n, d, f, 1.f, b.a.data(), f, at(p, u, kW2), d, 1.f, out, d);
  }
}

// dx_ holds the gradient of the block's output on entry and of its input on return.
void Model::block_backward(int l, const float* p, float* g, float aux_scale) {
  Block& b = *blocks_[l];
  const Unit& u = units_[1 + l];
  const int n = n_, d = c_.d_model, f = c_.d_ff;
  float* dx = dx_.data();
  float* dh = dh_.data();
  // MLP: out = x1 + mlp(h2), so d x1 = dx + RMSNorm'(d h2).
  std::fill(dh_.begin(), dh_.end(), 0.f);
  if (moe_[l]) {
    moe_[l]->backward(at(p, u, kRouter), b.h2.data(), dx, aux_scale, dh, at(g, u, kRouter));
  } else {
    float* da = dff_.data();
    gemm(false, true, n, f, d, 1.f, dx, d, at(p, u, kW2), d, 0.f, da, f);           // da = dx w2^T   [n, f]
    gemm(true, false, f, d, n, 1.f, b.a.data(), f, dx, d, 1.f, at(g, u, kW2), d);   // dw2 += a^T dx  [f, d]
    gelu_backward(b.u.data(), da, da, size_t(n) * f);                               // du            [n, f]
    gemm(true, false, d, f, n, 1.f, b.h2.data(), d, da, f, 1.f, at(g, u, kW1), f);  // dw1 += h2^T du [d, f]
    gemm(false, true, n, d, f, 1.f, da, f, at(p, u, kW1), f, 0.f, dh, d);           // dh2 = du w1^T  [n, d]
  }
  rmsnorm_backward(b.x1.data(), at(p, u, kLn2), b.rinv2.data(), dh, dx, at(g, u, kLn2), n, d);  // dx = d x1
  // Attention: x1 = x + att @ wo.
  gemm(true, false, d, d, n, 1.f, b.att.data(), d, dx, d, 1.f, at(g, u, kWo), d);  // dwo += att^T dx1
  gemm(false, true, n, d, d, 1.f, dx, d, at(p, u, kWo), d, 0.f, dh, d);            // datt = dx1 wo^T
  attention_backward(b.qkv.data(), b.probs.data(), dh, dqkv_.data(), scratch_.data(), nseq_, c_.seq_len, c_.n_heads,
                     c_.head_dim());
  gemm(true, false, d, 3 * d, n, 1.f, b.h1.data(), d, dqkv_.data(), 3 * d, 1.f, at(g, u, kWqkv), 3 * d);
  gemm(false, true, n, d, 3 * d, 1.f, dqkv_.data(), 3 * d, at(p, u, kWqkv), 3 * d, 0.f, dh, d);  // dh1
  rmsnorm_backward(xs_[l].data(), at(p, u, kLn1), b.rinv1.data(), dh, dx, at(g, u, kLn1), n, d);
}

Model::Losses Model::run(const uint8_t* batch, ParamStore& store, bool train, float ce_scale, float aux_scale) {
  const int n = n_, d = c_.d_model, T = c_.seq_len, V = c_.vocab, L = c_.n_layers;
  const int head = L + 1;
  for (int s = 0; s < nseq_; ++s) {
    std::memcpy(&inputs_[size_t(s) * T], batch + size_t(s) * (T + 1), T);
    std::memcpy(&targets_[size_t(s) * T], batch + size_t(s) * (T + 1) + 1, T);
  }
  Losses losses;
  aux_sum_ = 0;
  store.begin_pass(train);

  // Embeddings: x = wte[token] + wpe[position].
  const float* p = store.forward_params(0);
  const float* wte = at(p, units_[0], 0);
  const float* wpe = at(p, units_[0], 1);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j)
      xs_[0][size_t(i) * d + j] = wte[size_t(inputs_[i]) * d + j] + wpe[size_t(i % T) * d + j];
  store.forward_done(0);

  for (int l = 0; l < L; ++l) {
    block_forward(l, store.forward_params(1 + l));
    store.forward_done(1 + l);
  }
  losses.aux_sum = aux_sum_;

  // Head: logits = RMSNorm(x) @ wout, then cross-entropy (dlogits replace the logits when training).
  p = store.forward_params(head);
  rmsnorm_forward(xs_[L].data(), at(p, units_[head], 0), hf_.data(), rinvf_.data(), n, d);
  gemm(false, false, n, V, d, 1.f, hf_.data(), d, at(p, units_[head], 1), V, 0.f, logits_.data(), V);
  losses.ce_sum = cross_entropy(logits_.data(), targets_.data(), train ? logits_.data() : nullptr, n, V, ce_scale);
  store.forward_done(head);
  if (!train) {
    store.end_pass();
    return losses;
  }

  // Backward, units in reverse.
  p = store.backward_params(head);
  float* g = store.grads(head);
  const float* dlogits = logits_.data();
  gemm(true, false, d, V, n, 1.f, hf_.data(), d, dlogits, V, 1.f, at(g, units_[head], 1), V);  // dwout
  gemm(false, true, n, d, V, 1.f, dlogits, V, at(p, units_[head], 1), V, 0.f, dh_.data(), d);  // dhf
  std::fill(dx_.begin(), dx_.end(), 0.f);
  rmsnorm_backward(xs_[L].data(), at(p, units_[head], 0), rinvf_.data(), dh_.data(), dx_.data(), at(g, units_[head], 0),
                   n, d);
  store.backward_done(head);

  for (int l = L - 1; l >= 0; --l) {
    p = store.backward_params(1 + l);
    block_backward(l, p, store.grads(1 + l), aux_scale);
    store.backward_done(1 + l);
  }

  store.backward_params(0);
  g = store.grads(0);
  float* dwte = at(g, units_[0], 0);
  float* dwpe = at(g, units_[0], 1);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      dwte[size_t(inputs_[i]) * d + j] += dx_[size_t(i) * d + j];
      dwpe[size_t(i % T) * d + j] += dx_[size_t(i) * d + j];
    }
  store.backward_done(0);
  store.end_pass();
  return losses;
}

}  // namespace trainer
