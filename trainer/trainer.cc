#include "trainer/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "trainer/moe.h"
#include "trainer/ops.h"

namespace trainer {

namespace {

// The settings besides the model that decide the training trajectory, as "flag=value" (CheckpointMeta::training).
// Not among them: --steps (a resumed run may go on longer; the schedule then follows the new length), and what
// changes only speed or the validation numbers (--no-prefetch, --eval-seqs, --eval-every).
std::string settings_text(const TrainConfig& c, const Corpus& corpus) {
  // The training text, then the held-out text.
  const uint64_t h = fnv1a(corpus.val.data(), corpus.val.size(), fnv1a(corpus.train.data(), corpus.train.size()));
  char data[80];
  std::snprintf(data, sizeof(data), "%016llx:%zu+%zu", static_cast<unsigned long long>(h), corpus.train.size(),
                corpus.val.size());
  return "batch=" + std::to_string(c.batch) + " lr=" + shortest_text(c.lr) + " min-lr=" + shortest_text(c.min_lr) +
         " warmup=" + std::to_string(c.warmup) + " weight-decay=" + shortest_text(c.adam.weight_decay) +
         " clip=" + shortest_text(c.clip) + " aux-weight=" + shortest_text(c.aux_weight) +
         " seed=" + std::to_string(c.seed) + " compress=" + (c.compress.empty() ? std::string("none") : c.compress) +
         " data=" + data;
}

}  // namespace

Trainer::Trainer(const TrainConfig& cfg, const Corpus& corpus, Dist& dist)
    : cfg_(cfg),
      corpus_(corpus),
      settings_(settings_text(cfg, corpus)),
      dist_(dist),
      sampler_(hash_combine(cfg.seed, 0x64617461)) {
  cfg_.model.validate();
  const int N = dist.nranks();
  if (cfg.batch < 1 || cfg.batch % N != 0)
    throw std::invalid_argument("--batch " + std::to_string(cfg.batch) + " sequences do not divide over " +
                                std::to_string(N) + " ranks (each rank takes batch / ranks whole sequences)");
  if (cfg.model.n_experts > 0 && cfg.model.n_experts % N != 0)
    throw std::invalid_argument("--experts " + std::to_string(cfg.model.n_experts) + " do not divide over " +
                                std::to_string(N) + " ranks (each rank holds experts / ranks experts)");
  if (cfg.steps < 0) throw std::invalid_argument("--steps must be >= 0");
  local_seqs_ = cfg.batch / N;
  model_ = std::make_unique<Model>(cfg_.model, local_seqs_, cfg.seed, dist.distributed() ? &dist : nullptr);
  if (!cfg.compress.empty() && !dist.distributed())
    throw std::invalid_argument(
        "--compress compresses the FSDP gradient reduce-scatter: it needs several ranks "
        "(chorusrun -n N)");
  if (dist.distributed())
    store_ = std::make_unique<ShardedParams>(cfg_.model, model_->layout(), cfg.seed, dist, cfg.prefetch, cfg.compress);
  else
    store_ = std::make_unique<FullParams>(cfg_.model, model_->layout(), cfg.seed);
  dense_segs_ = store_->segments();
  for (MoeLayer* m : model_->moe_layers())
    for (const Segment& s : m->segments()) expert_segs_.push_back(s);

  // Validation: whole global batches of windows, the same ones whatever the number of ranks.
  const int T = cfg_.model.seq_len;
  val_ = validation_windows(corpus.val, T, cfg.eval_seqs);
  const int nwin = int(val_.size() / (T + 1)) / cfg.batch * cfg.batch;
  if (nwin == 0)
    throw std::invalid_argument("the held-out split (" + std::to_string(corpus.val.size()) +
                                " bytes) is too small for one batch of " + std::to_string(cfg.batch) +
                                " validation windows of " + std::to_string(T + 1) + " bytes");
  val_.resize(size_t(nwin) * (T + 1));
}

Trainer::~Trainer() = default;

Trainer::StepResult Trainer::step(const std::function<void()>& mid_step) {
  const auto t0 = std::chrono::steady_clock::now();
  const CommStats before = dist_.stats;
  const int T = cfg_.model.seq_len, B = cfg_.batch;
  const int t = ++step_;

  sampler_.next(corpus_.train, B, T, batch_);
  const uint8_t* mine = &batch_[size_t(dist_.rank()) * local_seqs_ * (T + 1)];
  const Model::Losses l = model_->run(mine, *store_, true, 1.f / float(size_t(B) * T), cfg_.aux_weight / float(B));
  if (mid_step) mid_step();

  // One all-reduce for the loss sums and the squared gradient norms. Dense shards are replicated over the
  // replicas of hybrid sharding, experts are not.
  double sums[4] = {l.ce_sum, l.aux_sum, grad_sq(dense_segs_), grad_sq(expert_segs_)};
  dist_.sum_world(sums);
  StepResult r;
  r.step = t;
  r.loss = sums[0] / (double(B) * T);
  r.aux = cfg_.aux_weight * sums[1] / B;
  r.grad_norm = std::sqrt(sums[2] / dist_.replicas() + sums[3]);
  const float mult = cfg_.clip > 0 && r.grad_norm > cfg_.clip ? float(cfg_.clip / r.grad_norm) : 1.f;
  r.lr = lr_at(t, cfg_.steps, cfg_.warmup, cfg_.lr, cfg_.min_lr);
  adamw_step(dense_segs_, cfg_.adam, float(r.lr), t, mult);
  adamw_step(expert_segs_, cfg_.adam, float(r.lr), t, mult);

  r.comm.seconds = dist_.stats.seconds - before.seconds;
  r.comm.bytes = dist_.stats.bytes - before.bytes;
  r.comm.calls = dist_.stats.calls - before.calls;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  history_.push_back({t, r.loss, -1});
  return r;
}

double Trainer::evaluate() {
  const int T = cfg_.model.seq_len, B = cfg_.batch;
  const size_t w = size_t(T) + 1, nwin = val_.size() / w;
  double sum[1] = {0};
  for (size_t first = 0; first < nwin; first += B)
    sum[0] += model_->run(&val_[(first + size_t(dist_.rank()) * local_seqs_) * w], *store_, false, 0, 0).ce_sum;
  dist_.sum_world(sum);
  const double loss = sum[0] / (double(nwin) * T);
  if (!history_.empty() && history_.back().step == step_) history_.back().val = loss;
  return loss;
}

ParamStore::Memory Trainer::memory() const {
  ParamStore::Memory m = store_->memory();
  for (MoeLayer* e : model_->moe_layers()) {
    const size_t b = e->params().size() * sizeof(float);
    m.params += b;
    m.grads += b;
    m.optimizer += 2 * b;
  }
  return m;
}

CheckpointMeta Trainer::meta() const {
  CheckpointMeta m;
  m.model_hash = cfg_.model.hash();
  m.model = cfg_.model.describe();
  m.training = settings_;
  m.collectives = collective_settings();
  m.nranks = dist_.nranks();
  m.shard_group = dist_.shard_size();
  m.step = step_;
  m.steps = cfg_.steps;
  m.rng = sampler_.rng_;
  m.drawn = sampler_.drawn;
  m.history = history_;
  return m;
}

// What a checkpoint holds for this rank: parameters and AdamW moments of its dense shard and of its experts.
std::vector<StateBuffer> Trainer::state() {
  std::vector<StateBuffer> s = store_->state();
  int i = 0;
  for (MoeLayer* m : model_->moe_layers()) {
    const std::string p = "moe" + std::to_string(i++) + ".";
    s.push_back({p + "params", m->params()});
    s.push_back({p + "adam_m", m->adam_m()});
    s.push_back({p + "adam_v", m->adam_v()});
  }
  return s;
}

std::string Trainer::save(const std::string& root, int keep, const std::function<void()>& die_midway) {
  return save_checkpoint(root, meta(), state(), dist_, keep, die_midway);
}

void Trainer::resume(const std::string& dir) {
  const CheckpointMeta m = load_checkpoint(dir, meta(), dist_.rank(), state());
  step_ = m.step;
  sampler_.rng_ = m.rng;
  sampler_.drawn = m.drawn;
  history_ = m.history;
}

}  // namespace trainer
