#include "trainer/fsdp.h"

#include <algorithm>

namespace trainer {

namespace {

// The optimizer segments of [lo, hi) of unit `unit`'s flat parameters, held at p/g/m/v (which point at element lo).
void add_segments(const Unit& unit, size_t lo, size_t hi, float* p, float* g, float* m, float* v,
                  std::vector<Segment>& out) {
  for (const Tensor& t : unit.tensors) {
    const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel());
    if (a < b) out.push_back({p + (a - lo), g + (a - lo), m + (a - lo), v + (a - lo), b - a, t.decay});
  }
}

}  // namespace

FullParams::FullParams(const ModelConfig& c, const std::vector<Unit>& units, uint64_t seed) : units_(units) {
  size_t total = 0;
  for (const Unit& u : units) {
    off_.push_back(total);
    total += u.numel;
  }
  params_.resize(total);
  grads_.assign(total, 0.f);
  m_.assign(total, 0.f);
  v_.assign(total, 0.f);
  for (size_t u = 0; u < units.size(); ++u) init_unit(c, units[u], int(u), seed, &params_[off_[u]], 0, units[u].numel);
}

float* FullParams::grads(int u) {
  std::fill_n(&grads_[off_[u]], units_[u].numel, 0.f);
  return &grads_[off_[u]];
}

std::vector<Segment> FullParams::segments() {
  std::vector<Segment> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const size_t o = off_[u];
    add_segments(units_[u], 0, units_[u].numel, &params_[o], &grads_[o], &m_[o], &v_[o], out);
  }
  return out;
}

std::vector<StateBuffer> FullParams::state() {
  return {{"dense.params", params_}, {"dense.adam_m", m_}, {"dense.adam_v", v_}};
}

ParamStore::Memory FullParams::memory() const {
  const size_t b = params_.size() * sizeof(float);
  return {b, b, 2 * b, 0};
}

ShardedParams::ShardedParams(const ModelConfig& c, const std::vector<Unit>& units, uint64_t seed, Dist& dist,
                             bool prefetch, const std::string& compress)
    : units_(units), dist_(dist), prefetch_(prefetch), S_(dist.shard_size()), rank_(dist.shard_rank()) {
  if (!compress.empty()) {
    static const std::pair<const char*, chorusCodec_t> kCodecs[] = {
        {"int8", chorusCodecInt8}, {"fp8_e4m3", chorusCodecFp8E4M3}, {"int4", chorusCodecInt4}};
    compressed_ = false;
    for (const auto& [name, codec] : kCodecs)
      if (compress == name) {
        compression_ = CHORUS_COMPRESSION_INIT(codec);
        compressed_ = true;
      }
    if (!compressed_) throw std::invalid_argument("--compress " + compress + ": expected int8, fp8_e4m3 or int4");
  }
  size_t total = 0, largest = 0;
  for (const Unit& u : units) {
    const size_t n = (u.numel + S_ - 1) / S_;
    shard_n_.push_back(n);
    shard_off_.push_back(total);
    total += n;
    largest = std::max(largest, n * S_);
  }
  params_.resize(total);
  grads_.assign(total, 0.f);
  m_.assign(total, 0.f);
  v_.assign(total, 0.f);
  // Each rank initialises only its own shard (ZeRO-3 never materialises the whole model in one place).
  for (size_t u = 0; u < units.size(); ++u)
    init_unit(c, units[u], int(u), seed, &params_[shard_off_[u]], rank_ * shard_n_[u], shard_n_[u]);
  for (Slot& s : pslot_) s.buf.assign(largest, 0.f);
  for (Slot& s : gslot_) s.buf.assign(largest, 0.f);
}

void ShardedParams::wait(Slot& s) {
  if (s.in_flight) {
    dist_.stats.wait(s.pending);
    s.in_flight = false;
  }
}

void ShardedParams::gather(int u) {
  Slot& s = pslot_[u % 2];
  wait(s);  // never in flight here in practice: a slot is reused two units later
  s.unit = u;
  const size_t n = shard_n_[u];
  std::span<const float> shard(&params_[shard_off_[u]], n);
  std::span<float> full(s.buf.data(), n * S_);
  if (prefetch_) {
    s.pending = dist_.shard()->iall_gather(shard, full);
    s.in_flight = true;
    dist_.stats.issued(full.size_bytes());
  } else {
    dist_.stats.timed(full.size_bytes(), [&] { dist_.shard()->all_gather(shard, full); });
  }
}

const float* ShardedParams::ensure_gathered(int u) {
  Slot& s = pslot_[u % 2];
  if (s.unit != u) gather(u);
  wait(s);
  return s.buf.data();
}

void ShardedParams::begin_pass(bool with_backward) {
  with_backward_ = with_backward;
  if (prefetch_) gather(0);
}

const float* ShardedParams::forward_params(int u) {
  const float* p = ensure_gathered(u);
  if (prefetch_ && u + 1 < int(units_.size())) gather(u + 1);  // overlaps with unit u's compute
  return p;
}

void ShardedParams::forward_done(int u) {
  // Reshard after forward; the last unit's backward comes next, so it stays.
  if (!(with_backward_ && u + 1 == int(units_.size()))) pslot_[u % 2].unit = -1;
}

const float* ShardedParams::backward_params(int u) {
  const float* p = ensure_gathered(u);
  if (prefetch_ && u > 0) gather(u - 1);
  return p;
}

float* ShardedParams::grads(int u) {
  Slot& s = gslot_[u % 2];
  wait(s);  // the reduce-scatter of unit u + 2, issued two units ago
  std::fill_n(s.buf.begin(), shard_n_[u] * S_, 0.f);
  s.unit = u;
  return s.buf.data();
}

void ShardedParams::backward_done(int u) {
  pslot_[u % 2].unit = -1;
  Slot& s = gslot_[u % 2];
  const size_t n = shard_n_[u];
  std::span<const float> full(s.buf.data(), n * S_);
  std::span<float> shard(&grads_[shard_off_[u]], n);
  // Compressed: quantize-once reduce-scatter (the codec's options are read when the call is issued).
  const chorus::CallOptions opt = compressed_ ? chorus::CallOptions{"qonce", &compression_} : chorus::CallOptions{};
  if (prefetch_) {
    s.pending = dist_.shard()->ireduce_scatter(full, shard, chorus::Op::Sum, opt);
    s.in_flight = true;
    dist_.stats.issued(full.size_bytes());
  } else {
    dist_.stats.timed(full.size_bytes(), [&] { dist_.shard()->reduce_scatter(full, shard, chorus::Op::Sum, opt); });
  }
}

void ShardedParams::end_pass() {
  for (Slot& s : gslot_) {
    wait(s);
    s.unit = -1;
  }
  for (Slot& s : pslot_) {  // a forward-only pass leaves no gather behind, but be sure
    wait(s);
    s.unit = -1;
  }
  if (with_backward_ && dist_.replica())  // hybrid: sum the shard's gradient over the replicas
    dist_.stats.timed(grads_.size() * sizeof(float),
                      [&] { dist_.replica()->all_reduce(std::span<float>(grads_), chorus::Op::Sum); });
}

std::vector<Segment> ShardedParams::segments() {
  std::vector<Segment> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const size_t o = shard_off_[u], lo = rank_ * shard_n_[u];
    add_segments(units_[u], lo, lo + shard_n_[u], &params_[o], &grads_[o], &m_[o], &v_[o], out);
  }
  return out;
}

// Shards with the same names as FullParams' whole vectors: a one-rank FSDP checkpoint and an unsharded one agree.
std::vector<StateBuffer> ShardedParams::state() {
  return {{"dense.params", params_}, {"dense.adam_m", m_}, {"dense.adam_v", v_}};
}

ParamStore::Memory ShardedParams::memory() const {
  const size_t b = params_.size() * sizeof(float);
  size_t transient = 0;
  for (const Slot* s : {&pslot_[0], &pslot_[1], &gslot_[0], &gslot_[1]}) transient += s->buf.size() * sizeof(float);
  return {b, b, 2 * b, transient};
}

}  // namespace trainer
