// One training run: the model, its parameter store (unsharded or FSDP), the experts, AdamW, the data, and the
// step, evaluation and checkpoint logic that main.cc and the tests drive.
//
// Every rank draws the same global batch and takes its slice (batch / nranks whole sequences). The loss is the
// mean over the global batch, so each rank's backward is scaled by 1 / (global tokens) and the sum of the ranks'
// gradients (the reduce-scatter) is the gradient of the global loss: the same quantity one process computes for
// the whole batch, which is what the equivalence tests check.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/checkpoint.h"
#include "trainer/data.h"
#include "trainer/dist.h"
#include "trainer/fsdp.h"
#include "trainer/model.h"
#include "trainer/optim.h"

namespace trainer {

struct TrainConfig {
  ModelConfig model;
  int batch = 16;  // global batch, in sequences of model.seq_len + 1 bytes
  int steps = 300;
  float lr = 3e-3f, min_lr = 3e-4f;
  int warmup = 30;
  AdamWConfig adam;
  float clip = 1.0f;  // global gradient norm limit; 0: no clipping
  float aux_weight = 0.01f;
  uint64_t seed = 1;
  int eval_seqs = 128;  // validation windows (rounded down to a multiple of batch)
  bool prefetch = true;
  // Codec of the FSDP gradient reduce-scatter ("int8", "fp8_e4m3", "int4"; empty: fp32). Quantize-once: each
  // rank's gradient quantized once on its way to the shard's owner, summed in fp32 there (docs/compression.md).
  std::string compress;
};

class Trainer {
 public:
  // dist: not distributed -> every parameter here (FullParams); distributed -> FSDP over dist's shard groups and
  // experts over its ranks. Throws std::invalid_argument when the run does not fit (batch or experts that do not
  // divide over the ranks, a held-out split too small for one batch).
  Trainer(const TrainConfig& cfg, const Corpus& corpus, Dist& dist);
  ~Trainer();

  struct StepResult {
    int step = 0;
    double loss = 0;  // mean cross-entropy of the global batch, nats per byte
    double aux = 0;   // aux_weight * load-balancing loss (mean over sequences, summed over MoE blocks)
    double lr = 0, grad_norm = 0;
    double seconds = 0;  // wall time of the step
    CommStats comm;      // spent in collectives during the step
  };
  // mid_step, when set, runs after the backward pass (gradients reduced) and before the optimizer: the fault tests
  // kill a rank there.
  StepResult step(const std::function<void()>& mid_step = {});
  // Mean cross-entropy over the validation windows; recorded in the history against the current step.
  double evaluate();

  int step_count() const { return step_; }
  const std::vector<HistoryRow>& history() const { return history_; }

  // Parameters, gradients and optimizer state this rank holds (dense shard plus its experts), and the transient
  // gather buffers.
  ParamStore::Memory memory() const;

  // The settings besides the model that decide the trajectory, "flag=value ..." with a hash of the text
  // (CheckpointMeta::training).
  const std::string& training_settings() const { return settings_; }

  // Checkpoints: collective; save returns the directory written. resume throws if the checkpoint does not fit.
  std::string save(const std::string& root, int keep, const std::function<void()>& die_midway = {});
  void resume(const std::string& dir);

  // For tests: the dense parameter store and the model.
  ParamStore& store() { return *store_; }
  Model& model() { return *model_; }

 private:
  CheckpointMeta meta() const;
  std::vector<StateBuffer> state();

  TrainConfig cfg_;
  const Corpus& corpus_;
  std::string settings_;  // training_settings(): the corpus is hashed once
  Dist& dist_;
  int local_seqs_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ParamStore> store_;
  std::vector<Segment> dense_segs_, expert_segs_;
  Sampler sampler_;
  std::vector<uint8_t> batch_, val_;
  int step_ = 0;
  std::vector<HistoryRow> history_;
};

}  // namespace trainer
