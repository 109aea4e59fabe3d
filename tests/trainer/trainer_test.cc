// The reference trainer's tests: the hand-written backward against finite differences, FSDP and MoE against the
// same computation in one process, checkpoints that survive a killed rank, and clear errors for bad input.
// Equivalence tests run ranks as threads (chorus::Comm over the local transport); the rest run the chorus-trainer
// binary under chorusrun (CHORUSRUN and CHORUS_TRAINER are the built binaries' paths).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chorus/chorus.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/process.h"
#include "trainer/data.h"
#include "trainer/dist.h"
#include "trainer/moe.h"
#include "trainer/ops.h"
#include "trainer/trainer.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer;
using chorus::test::count_of;
using chorus::test::Result;

// English-like text with some structure to learn: sentences from a small grammar.
std::string sample_text(size_t bytes) {
  static const char* subjects[] = {"the licensee", "each contributor", "the program", "a covered work", "you"};
  static const char* verbs[] = {"may copy", "shall distribute", "must not modify", "can convey", "will include"};
  static const char* objects[] = {"the source code", "this license", "any warranty", "the notice", "a copy of it"};
  std::mt19937 rng(7);
  std::string s;
  while (s.size() < bytes) {
    s += subjects[rng() % 5];
    s += ' ';
    s += verbs[rng() % 5];
    s += ' ';
    s += objects[rng() % 5];
    s += rng() % 3 ? ". " : ".\n";
  }
  return s;
}

const Corpus& test_corpus() {
  static const Corpus c = Corpus::from_text(sample_text(60000), 0.1, 64, "sample");
  return c;
}

ModelConfig tiny(int experts) {
  ModelConfig m;
  m.seq_len = 16;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 2;
  m.d_ff = 64;
  m.n_experts = experts;
  m.top_k = 2;
  m.capacity_factor = 1.0f;  // tight enough that some choices are dropped
  m.d_expert = 32;
  m.moe_every = 2;
  return m;
}

// Runs fn on n ranks, each a thread with its own communicator.
void run_ranks(int n, const std::function<void(chorus::Comm&)>& fn) {
  setenv("CHORUS_TIMEOUT_MS", "60000", 0);
  chorus::UniqueId id = chorus::UniqueId::create();
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        chorus::Comm comm(n, id, r);
        fn(comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// ---- (a) the backward against finite differences ----

// The loss whose gradient Model::run computes with these scales.
double objective(Model& model, ParamStore& store, const std::vector<uint8_t>& batch, int nseq, float aux_weight) {
  const ModelConfig& c = model.config();
  const Model::Losses l = model.run(batch.data(), store, false, 0, 0);
  return l.ce_sum / (double(nseq) * c.seq_len) + aux_weight * l.aux_sum / nseq;
}

void gradient_check(int experts) {
  blas_init();
  ModelConfig c = tiny(experts);
  c.seq_len = 8;
  c.init_std = 0.2f;         // larger weights: larger, less linear gradients to check
  c.capacity_factor = 4.0f;  // no drops: the function is smooth where we probe it
  const int nseq = 2;
  const float aux_weight = 0.1f;
  Model model(c, nseq, 3, nullptr);
  FullParams store(c, model.layout(), 3);
  std::vector<uint8_t> batch;
  Sampler(5).next(test_corpus().train, nseq, c.seq_len, batch);
  model.run(batch.data(), store, true, 1.f / (nseq * c.seq_len), aux_weight / nseq);
  const std::vector<float> grads = store.all_grads();

  // Every tensor: its largest-gradient elements and a few others; and every expert tensor likewise.
  struct Probe {
    std::string what;
    float* param;
    float grad;
  };
  std::vector<Probe> probes;
  auto pick = [&](const std::string& name, float* p, const float* g, size_t n) {
    std::vector<size_t> idx(n);
    for (size_t i = 0; i < n; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + std::min<size_t>(3, n), idx.end(),
                      [&](size_t a, size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
    for (size_t k = 0; k < std::min<size_t>(3, n); ++k) probes.push_back({name, p + idx[k], g[idx[k]]});
    for (size_t k = 1; k <= 2; ++k) probes.push_back({name, p + (k * 7919) % n, g[(k * 7919) % n]});
  };
  size_t off = 0;
  std::vector<float>& params = store.all_params();
  for (const Unit& u : model.layout()) {
    for (const Tensor& t : u.tensors)
      pick(u.name + "." + t.name, &params[off + t.offset], &grads[off + t.offset], t.numel());
    off += u.numel;
  }
  for (MoeLayer* m : model.moe_layers()) {
    const std::vector<float> eg = m->grads();
    const size_t half = m->expert_numel() / 2;
    for (int e = 0; e < m->local_experts(); ++e) {
      pick("expert" + std::to_string(e) + ".w1", &m->params()[e * 2 * half], &eg[e * 2 * half], half);
      pick("expert" + std::to_string(e) + ".w2", &m->params()[e * 2 * half + half], &eg[e * 2 * half + half], half);
    }
  }

  // Top-k routing is piecewise: a probe whose nudge changes which experts a token picks straddles a jump, where a
  // finite difference means nothing; those are skipped (and must be rare).
  auto routing = [&] {
    std::vector<std::pair<int, int>> r;
    for (MoeLayer* m : model.moe_layers())
      for (const MoeLayer::Route& x : m->routes()) r.push_back({x.token, x.expert});
    return r;
  };
  const float h = 5e-3f;
  int checked = 0, skipped = 0;
  for (const Probe& p : probes) {
    const float saved = *p.param;
    *p.param = saved + h;
    const double up = objective(model, store, batch, nseq, aux_weight);
    const auto routes_up = routing();
    *p.param = saved - h;
    const double down = objective(model, store, batch, nseq, aux_weight);
    const auto routes_down = routing();
    *p.param = saved;
    if (routes_up != routes_down) {
      ++skipped;
      continue;
    }
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(p.grad, fd, 2e-4 + 3e-2 * std::fabs(fd)) << p.what;
    ++checked;
  }
  std::printf("gradient check: %d probes agree, %d skipped at a routing change\n", checked, skipped);
  EXPECT_GT(checked, 40);
  EXPECT_LE(skipped, checked / 10);
}

// --val-fraction F holds out F of the text (it used to hold out 1 / round(1 / F): 50% at 0.9, 33% at 0.4), spread
// evenly; at 0.1 every 10th block, as always.
TEST(Corpus, ValFractionIsTheShareHeldOut) {
  const std::string text = sample_text(200000);
  for (double f : {0.05, 0.1, 0.25, 0.4, 0.6, 0.9}) {
    const Corpus c = Corpus::from_text(text, f, 64);
    EXPECT_NEAR(double(c.val.size()) / double(text.size()), f, 0.045) << f;  // within a block: 24 at 0.4 and 0.6
    EXPECT_EQ(c.train.size() + c.val.size(), text.size());
  }
  // 0.1: blocks 9, 19, 29, ... (the block is 200000 / 80 = 2500 bytes).
  const Corpus c = Corpus::from_text(text, 0.1, 64);
  EXPECT_EQ(std::string(c.val.begin(), c.val.begin() + 2500), text.substr(9 * 2500, 2500));
}

TEST(GradientCheck, DenseModelMatchesFiniteDifferences) { gradient_check(0); }
TEST(GradientCheck, MoeModelMatchesFiniteDifferences) { gradient_check(4); }

TEST(Optimizer, ClippingAndScheduleAndUnigramBaseline) {
  EXPECT_FLOAT_EQ(lr_at(1, 100, 10, 1.f, 0.1f), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(10, 100, 10, 1.f, 0.1f), 1.f);
  EXPECT_NEAR(lr_at(100, 100, 10, 1.f, 0.1f), 0.1f, 1e-6);
  // One AdamW step moves every parameter by about lr against the sign of its gradient (plus decay).
  std::vector<float> p = {1.f, -1.f}, g = {0.5f, -2.f}, m(2), v(2);
  adamw_step({Segment{p.data(), g.data(), m.data(), v.data(), 2, true}}, AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f}, 0.01f,
             1, 1.f);
  EXPECT_NEAR(p[0], 1.f - 0.01f - 0.001f, 1e-6);
  EXPECT_NEAR(p[1], -1.f + 0.01f + 0.001f, 1e-6);
  // The unigram baseline of the test text is between the entropy of a few letters and 8 bits.
  const double u = unigram_baseline(test_corpus());
  EXPECT_GT(u, 2.0);
  EXPECT_LT(u, std::log(256.0));
}

// ---- (b) FSDP: 1, 2 and 4 ranks against one process ----

TrainConfig small_run(int experts) {
  TrainConfig t;
  t.model = tiny(experts);
  t.batch = 8;
  t.steps = 20;
  t.lr = 1e-2f;
  t.min_lr = 1e-3f;
  t.warmup = 3;
  t.eval_seqs = 16;
  t.seed = 11;
  return t;
}

std::vector<double> reference_losses(const TrainConfig& t) {
  blas_init();
  Dist single;
  Trainer trainer(t, test_corpus(), single);
  std::vector<double> losses;
  for (int s = 0; s < t.steps; ++s) losses.push_back(trainer.step().loss);
  losses.push_back(trainer.evaluate());
  return losses;
}

std::vector<double> sharded_losses(const TrainConfig& t, int n, int shard_group, bool prefetch = true,
                                   const std::string& compress = "") {
  std::vector<double> losses;
  TrainConfig cfg = t;
  cfg.prefetch = prefetch;
  cfg.compress = compress;
  run_ranks(n, [&](chorus::Comm& comm) {
    Dist dist(comm, shard_group);
    Trainer trainer(cfg, test_corpus(), dist);
    std::vector<double> mine;
    for (int s = 0; s < cfg.steps; ++s) mine.push_back(trainer.step().loss);
    mine.push_back(trainer.evaluate());
    if (comm.rank() == 0) losses = mine;
  });
  return losses;
}

void expect_same_losses(const std::vector<double>& want, const std::vector<double>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double rel = std::fabs(got[i] - want[i]) / std::fabs(want[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-5) << what << ": step " << i + 1 << ": " << got[i] << " vs " << want[i];
  }
  // Training really happened: the loss fell.
  EXPECT_LT(want[want.size() - 2], want[0] - 0.5) << what;
  std::printf("%s: worst relative difference %.2e over %zu losses\n", what.c_str(), worst, want.size());
}

TEST(Fsdp, SameLossesAsOneProcessAt1And2And4Ranks) {
  const TrainConfig t = small_run(0);
  const std::vector<double> want = reference_losses(t);
  for (int n : {1, 2, 4}) expect_same_losses(want, sharded_losses(t, n, 0), "dense, " + std::to_string(n) + " ranks");
}

TEST(Fsdp, SameLossesWithMoeAt1And2And4Ranks) {
  const TrainConfig t = small_run(4);
  const std::vector<double> want = reference_losses(t);
  for (int n : {1, 2, 4}) expect_same_losses(want, sharded_losses(t, n, 0), "MoE, " + std::to_string(n) + " ranks");
}

TEST(Fsdp, HybridShardingAndBlockingCollectivesGiveTheSameLosses) {
  const TrainConfig t = small_run(4);
  const std::vector<double> want = reference_losses(t);
  expect_same_losses(want, sharded_losses(t, 4, 2), "hybrid, 2 groups of 2");
  expect_same_losses(want, sharded_losses(t, 2, 0, false), "no prefetch, 2 ranks");
}

TEST(Fsdp, CompressedGradientReduceScatterTrainsCloseToFp32) {
  // Quantize-once int8 gradients (each contribution quantized once, summed in fp32 at the shard's owner): the loss
  // trajectory stays within a few percent of the fp32 one and falls as far; int4 is coarser and is only required to
  // train.
  const TrainConfig t = small_run(0);
  const std::vector<double> want = reference_losses(t);
  for (bool prefetch : {true, false}) {
    const std::vector<double> got = sharded_losses(t, 4, 0, prefetch, "int8");
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / want[i]);
    std::printf("int8 gradients, 4 ranks, prefetch %d: worst relative loss difference %.2e\n", prefetch, worst);
    EXPECT_LE(worst, 3e-2);
    EXPECT_GT(worst, 0.0);  // it did compress
  }
  const std::vector<double> int4 = sharded_losses(t, 4, 0, true, "int4");
  EXPECT_LT(int4[int4.size() - 2], int4[0] - 0.5) << "int4 gradients: the loss did not fall";
}

TEST(Fsdp, StatePerRankFallsAsOneOverN) {
  TrainConfig t = small_run(4);
  t.model.d_model = 64;
  t.model.d_ff = 256;
  Dist single;
  const ParamStore::Memory one = Trainer(t, test_corpus(), single).memory();
  for (int n : {2, 4})
    run_ranks(n, [&](chorus::Comm& comm) {
      Dist dist(comm, 0);
      const ParamStore::Memory m = Trainer(t, test_corpus(), dist).memory();
      // Padding to a multiple of n adds at most n - 1 elements per unit.
      const double ideal = double(one.params) / n;
      EXPECT_GE(double(m.params), ideal);
      EXPECT_LE(double(m.params), ideal + 4.0 * n * 4 * sizeof(float));
      EXPECT_EQ(m.grads, m.params);
      EXPECT_EQ(m.optimizer, 2 * m.params);
    });
}

// ---- (d) MoE: experts over 4 ranks against the same layer in one process ----

TEST(Moe, ExpertParallelLayerEqualsOneProcess) {
  blas_init();
  const int d = 16, E = 8, T = 12, nseq = 8, ranks = 4;
  MoeConfig mc{d, 24, E, 2, T, 1.0f};
  const int n = nseq * T;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> h(size_t(n) * d), router(size_t(d) * E), dy(size_t(n) * d);
  for (float& x : h) x = nd(rng);
  for (float& x : router) x = 0.5f * nd(rng);
  for (float& x : dy) x = nd(rng);
  const float aux_scale = 0.3f;

  MoeLayer ref(mc, 1, 9, 0.2f, 0.2f, nullptr, nullptr);
  std::vector<float> y_ref(h.size()), dh_ref(h.size(), 0.f), dr_ref(router.size(), 0.f);
  const double aux_ref = ref.forward(router.data(), h.data(), y_ref.data(), nseq);
  ref.backward(router.data(), h.data(), dy.data(), aux_scale, dh_ref.data(), dr_ref.data());
  ASSERT_LT(ref.routes().size(), size_t(n) * 2) << "capacity should drop some choices";

  std::vector<float> y(h.size()), dh(h.size()), dr(router.size(), 0.f);
  std::vector<double> aux(ranks);
  std::vector<std::vector<float>> expert_grads(ranks);
  std::mutex mu;
  run_ranks(ranks, [&](chorus::Comm& comm) {
    const int r = comm.rank(), local = n / ranks;
    MoeLayer layer(mc, 1, 9, 0.2f, 0.2f, &comm, nullptr);
    EXPECT_EQ(layer.local_experts(), E / ranks);
    std::vector<float> my_y(size_t(local) * d), my_dh(size_t(local) * d, 0.f), my_dr(router.size(), 0.f);
    const size_t o = size_t(r) * local * d;
    aux[r] = layer.forward(router.data(), &h[o], my_y.data(), nseq / ranks);
    layer.backward(router.data(), &h[o], &dy[o], aux_scale, my_dh.data(), my_dr.data());
    std::lock_guard<std::mutex> lock(mu);
    std::copy(my_y.begin(), my_y.end(), y.begin() + o);
    std::copy(my_dh.begin(), my_dh.end(), dh.begin() + o);
    for (size_t i = 0; i < dr.size(); ++i) dr[i] += my_dr[i];
    expert_grads[r] = layer.grads();
  });

  auto expect_close = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    float scale = 0;
    for (float w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * std::max(1.f, scale)) << what << "[" << i << "]";
  };
  expect_close(y, y_ref, "output");
  expect_close(dh, dh_ref, "input gradient");
  expect_close(dr, dr_ref, "router gradient");
  std::vector<float> eg;
  for (const auto& g : expert_grads) eg.insert(eg.end(), g.begin(), g.end());
  expect_close(eg, ref.grads(), "expert gradients");
  EXPECT_NEAR(aux[0] + aux[1] + aux[2] + aux[3], aux_ref, 1e-9 * std::fabs(aux_ref));
}

TEST(Moe, ExpertsThatDoNotDivideOverTheRanksAreRefused) {
  run_ranks(2, [&](chorus::Comm& comm) {
    Dist dist(comm, 0);
    TrainConfig t = small_run(3);
    try {
      Trainer trainer(t, test_corpus(), dist);
      ADD_FAILURE() << "3 experts over 2 ranks were accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--experts 3 do not divide over 2 ranks"), std::string::npos) << e.what();
    }
  });
}

// ---- (c) checkpoints and (e) the command line, as real processes under chorusrun ----

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("chorus-trainer-test-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    data_ = (dir_ / "text.txt").string();
    std::ofstream(data_) << sample_text(60000);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // The trainer with this test's data and a tiny model, before `--out` and the test's own flags.
  std::string tiny() const {
    return std::string(CHORUS_TRAINER) + " --data " + data_ +
           " --seq-len 16 --d-model 32 --layers 2 --heads 2 --d-ff 64 --experts 2 --d-expert 32 --batch 4"
           " --eval-seqs 8 --eval-every 0 --warmup 2 --lr 1e-2 --no-plot";
  }
  // chorusrun for n ranks, whose command follows.
  static std::string launch(int n) {
    return "CHORUS_TIMEOUT_MS=30000 " + std::string(CHORUSRUN) + " -n " + std::to_string(n) + " --timeout 120 ";
  }
  // The trainer under chorusrun with n ranks (0: one process, no launcher), a tiny model and this test's data.
  Result trainer(int n, const std::string& out, const std::string& args) {
    return chorus::test::run((n > 0 ? launch(n) : std::string("CHORUS_TIMEOUT_MS=30000 ")) + tiny() + " --out " +
                             (dir_ / out).string() + " " + args);
  }
  std::string file(const std::string& rel) {
    std::ifstream in(dir_ / rel);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // "step N/M  loss X" of every progress line, in order.
  static std::vector<std::string> loss_lines(const std::string& out) {
    static const std::regex re(R"(step +\d+/\d+  loss [0-9.]+)");
    std::vector<std::string> lines;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
      lines.push_back(it->str());
    return lines;
  }
  fs::path dir_;
  std::string data_;
};

TEST_F(Cli, KilledRankThenResumeContinuesTheSameLossTrajectory) {
  Result whole = trainer(2, "whole", "--steps 12 --ckpt-every 4");
  ASSERT_EQ(whole.code, 0) << whole.out;
  const std::vector<std::string> want = loss_lines(whole.out);
  ASSERT_EQ(want.size(), 12u) << whole.out;

  // Rank 1 dies in step 10, after its backward: checkpoint 8 is the last one.
  Result killed = trainer(2, "cut", "--steps 12 --ckpt-every 4 --kill-at 1:10");
  EXPECT_NE(killed.code, 0) << killed.out;
  EXPECT_NE(killed.out.find("killed by signal 9"), std::string::npos) << killed.out;
  EXPECT_TRUE(fs::exists(dir_ / "cut/checkpoints/step-00000008/meta.txt"));

  Result resumed = trainer(2, "cut", "--steps 12 --ckpt-every 4 --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  const std::vector<std::string> got = loss_lines(resumed.out);
  ASSERT_EQ(got.size(), 4u) << resumed.out;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[8 + i]);
  // The whole trajectory, bit for bit (9 significant digits), including the steps before the kill.
  EXPECT_EQ(file("cut/loss.tsv"), file("whole/loss.tsv"));
}

TEST_F(Cli, RankKilledWhileWritingACheckpointLeavesNoTornOne) {
  Result whole = trainer(2, "whole", "--steps 10 --ckpt-every 4");
  ASSERT_EQ(whole.code, 0) << whole.out;

  Result killed = trainer(2, "cut", "--steps 10 --ckpt-every 4 --kill-at 1:8:checkpoint");
  EXPECT_NE(killed.code, 0) << killed.out;
  // Checkpoint 8 was never published; its temporary directory is all that is left of it.
  EXPECT_FALSE(fs::exists(dir_ / "cut/checkpoints/step-00000008"));
  EXPECT_TRUE(fs::exists(dir_ / "cut/checkpoints/step-00000008.tmp"));
  EXPECT_TRUE(fs::exists(dir_ / "cut/checkpoints/step-00000004/meta.txt"));

  Result resumed = trainer(2, "cut", "--steps 10 --ckpt-every 4 --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("step-00000004"), std::string::npos) << resumed.out;
  EXPECT_EQ(file("cut/loss.tsv"), file("whole/loss.tsv"));
  EXPECT_FALSE(fs::exists(dir_ / "cut/checkpoints/step-00000008.tmp"));
}

TEST_F(Cli, ResumingFromAnOlderCheckpointNeverLosesTheNewOnesItWrites) {
  Result first = trainer(0, "run", "--steps 6 --ckpt-every 2 --keep 3");
  ASSERT_EQ(first.code, 0) << first.out;
  // Resuming from step 2 into the folder that holds steps 4 and 6 of the first run: refused, nothing changed.
  const std::string older = (dir_ / "run/checkpoints/step-00000002").string();
  Result refused = trainer(0, "run", "--steps 6 --ckpt-every 3 --resume-from " + older);
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_NE(refused.out.find("checkpoints after the one resumed from (step-00000004, step-00000006)"),
            std::string::npos)
      << refused.out;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000006/meta.txt"));
  // A resume that cannot load (another model) deletes nothing, --overwrite or not.
  Result wrong = trainer(0, "run", "--steps 6 --d-ff 96 --overwrite --resume-from " + older);
  EXPECT_EQ(wrong.code, 1) << wrong.out;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000006/meta.txt"));
  // With --overwrite the later ones go, and the checkpoints this run reports are the ones kept and resumed.
  Result again = trainer(0, "run", "--steps 6 --ckpt-every 3 --keep 3 --overwrite --resume-from " + older);
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000003/meta.txt")) << again.out;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000006/meta.txt")) << again.out;
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints/step-00000004")) << again.out;
  Result resumed = trainer(0, "run", "--steps 8 --ckpt-every 3 --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("step-00000006"), std::string::npos) << resumed.out;
}

// Checkpoints are deleted by renaming them to .del first (remove_checkpoint), so a kill while deleting leaves no torn
// checkpoint under its name (it used to: meta.txt still there, rank files gone, and --resume took it). What such a
// kill leaves, a .del directory, or a step directory without meta.txt from before, is never resumed and is removed
// by the next checkpoint.
TEST_F(Cli, HalfDeletedCheckpointsAreNeverResumedAndAreCleanedUp) {
  Result r = trainer(0, "run", "--steps 6 --ckpt-every 2 --keep 3");
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path ck = dir_ / "run/checkpoints";
  // A deletion of step 6 cut short after its rename, and a step-8 directory that lost its meta.txt.
  fs::rename(ck / "step-00000006", ck / "step-00000006.del");
  fs::remove(ck / "step-00000006.del/rank-0.bin");
  fs::create_directory(ck / "step-00000008");
  fs::copy_file(ck / "step-00000004/rank-0.bin", ck / "step-00000008/rank-0.bin");
  // And what a fresh --overwrite cut short leaves: the old checkpoints directory renamed away, half deleted.
  fs::create_directories(dir_ / "run/checkpoints.del/step-00000002");
  r = trainer(0, "run", "--steps 7 --ckpt-every 2 --keep 3 --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + (ck / "step-00000004").string()), std::string::npos) << r.out;
  // The step directory without meta.txt is passed over with a warning (helper-77: it went silently), then removed.
  EXPECT_NE(r.out.find("warning: '" + (ck / "step-00000008").string() + "' has no meta.txt"), std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(ck / "step-00000006.del"));
  EXPECT_FALSE(fs::exists(ck / "step-00000008"));
  EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints.del"));
  // Pruning beyond --keep 1 leaves only the newest, and no .del behind.
  r = trainer(0, "run", "--steps 9 --ckpt-every 1 --keep 1 --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(ck)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"step-00000009"});
}

// meta.txt ends with a checksum of its lines: cut short or edited, it is refused naming the file, not half read
// (a truncated one used to resume with an empty history and a reset sampler, exit 0).
TEST_F(Cli, ADamagedMetaTxtIsRefused) {
  Result r = trainer(0, "run", "--steps 4 --ckpt-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path meta = dir_ / "run/checkpoints/step-00000004/meta.txt";
  const std::string good = file("run/checkpoints/step-00000004/meta.txt");
  for (const std::string& bad :
       {good.substr(0, good.size() / 2), std::regex_replace(good, std::regex("\ndrawn "), "\ndrawn 1")}) {
    std::ofstream(meta, std::ios::trunc) << bad;
    r = trainer(0, "run", "--steps 6 --resume");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("meta.txt is damaged"), std::string::npos) << r.out;
  }
  std::ofstream(meta, std::ios::trunc) << good;
  r = trainer(0, "run", "--steps 6 --resume");
  EXPECT_EQ(r.code, 0) << r.out;
}

// The settings that decide the trajectory are recorded; a resume with others is refused naming each flag (it used
// to train on silently). --steps may change: a resumed run may go on longer.
TEST_F(Cli, ResumingWithOtherTrainingFlagsIsRefusedNamingThem) {
  Result r = trainer(0, "run", "--steps 2 --ckpt-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  r = trainer(0, "run", "--steps 4 --resume --lr 2e-2 --batch 8");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("was trained with other settings"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--lr 0.02 (checkpoint: 0.01)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--batch 8 (checkpoint: 4)"), std::string::npos) << r.out;
  r = trainer(0, "run", "--steps 4 --resume --val-fraction 0.2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--data / --val-fraction: another text"), std::string::npos) << r.out;
  r = trainer(0, "run", "--steps 4 --resume");
  EXPECT_EQ(r.code, 0) << r.out;
}

// Every rank must get the same options (paths compared as absolute paths); a rank started with another is refused
// before training, naming the option (it used to train on mixed settings, exit 0).
TEST_F(Cli, RanksStartedWithOtherOptionsAreRefused) {
  Result r = chorus::test::run(launch(2) + "sh -c 'if [ \"$CHORUS_RANK\" = 1 ]; then X=\"--seed 5\"; fi; exec " +
                               tiny() + " --out " + (dir_ / "run").string() + " --steps 2 $X'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 was started with another --seed than rank 0 (rank 0: '1')"), std::string::npos) << r.out;
  // One relative --out under two working directories is two directories.
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  r = chorus::test::run(launch(2) + "sh -c 'if [ \"$CHORUS_RANK\" = 0 ]; then cd " + (dir_ / "a").string() +
                        "; else cd " + (dir_ / "b").string() + "; fi; exec " + tiny() + " --out run --steps 2'");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1 was started with another --out than rank 0"), std::string::npos) << r.out;
  // The text may sit at another path on another host; what is compared is the text itself.
  fs::copy_file(data_, dir_ / "same.txt");
  std::ofstream(dir_ / "other.txt") << sample_text(50000);
  for (const char* file : {"same.txt", "other.txt"}) {
    r = chorus::test::run(launch(2) + "sh -c 'D=" + data_ +
                          "; if [ \"$CHORUS_RANK\" = 1 ]; then D=" + (dir_ / file).string() + "; fi; exec " + tiny() +
                          " --data $D --out " + (dir_ / file).string() + ".run --steps 2'");
    if (std::string(file) == "same.txt") {
      EXPECT_EQ(r.code, 0) << r.out;
    } else {
      EXPECT_NE(r.code, 0) << r.out;
      EXPECT_NE(r.out.find("rank 1 reads another text than rank 0 from --data"), std::string::npos) << r.out;
    }
  }
}

// Ranks that see other checkpoints under the same path (a file system not shared between hosts; here rank 1 runs in
// a mount namespace where another directory is mounted over the run's) are refused before anything is loaded or
// deleted (they used to load steps 4 and 2 and wait on each other until the timeout, or wait in a barrier the
// others skipped). Needs root for the mount namespace.
TEST_F(Cli, RanksThatSeeOtherCheckpointsAreRefused) {
  if (geteuid() != 0 || chorus::test::run("unshare -m true").code != 0)
    GTEST_SKIP() << "needs root and unshare(1) for a mount namespace";
  const std::string cmd = tiny() + " --out " + (dir_ / "run").string() + " --ckpt-every 2";
  Result r = chorus::test::run(launch(2) + cmd + " --steps 4");
  ASSERT_EQ(r.code, 0) << r.out;
  fs::copy(dir_ / "run", dir_ / "other", fs::copy_options::recursive);
  fs::remove_all(dir_ / "other/checkpoints/step-00000004");
  // Rank 1 sees "other" at the run's path.
  const std::string script = (dir_ / "ranks.sh").string();
  std::ofstream(script) << "if [ \"$CHORUS_RANK\" = 1 ]; then\n"
                        << "  exec unshare -m sh -c \"mount --bind " << (dir_ / "other").string() << " "
                        << (dir_ / "run").string() << " && exec " << cmd << " --steps 6 $1\"\n"
                        << "fi\n"
                        << "exec " << cmd << " --steps 6 $1\n";
  for (const std::string& mode : {std::string("--resume"), std::string("--overwrite")}) {
    r = chorus::test::run(launch(2) + "sh " + script + " " + mode);
    EXPECT_NE(r.code, 0) << mode << ": " << r.out;
    EXPECT_NE(r.out.find(mode == "--resume" ? "rank 0 resumes from step 4 but rank 1 from step 2"
                                            : "rank 1 sees other checkpoints under"),
              std::string::npos)
        << mode << ": " << r.out;
  }
  // Nothing was deleted or written by either.
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000004/meta.txt"));
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000002/meta.txt"));
}

// Writing the loss curve can fail (disk full, a directory in the way): an error, not "loss curve: ..." and exit 0.
TEST_F(Cli, ALossCurveThatCannotBeWrittenIsAnError) {
  fs::create_directories(dir_ / "run/loss.tsv");
  Result r = trainer(0, "run", "--steps 1 --ckpt-every 0");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot write '" + (dir_ / "run").string() + "/loss.tsv'"), std::string::npos) << r.out;
}

TEST_F(Cli, OneProcessRunTrainsAndPrintsEverything) {
  Result r = trainer(0, "run", "--steps 6 --ckpt-every 3 --eval-every 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(loss_lines(r.out).size(), 6u) << r.out;
  EXPECT_NE(r.out.find("unigram baseline"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.out, "eval  step"), 2) << r.out;
  EXPECT_NE(r.out.find("== summary"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("state per rank"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(file("run/loss.tsv"), "\n"), 7);  // header + 6 steps
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000006/rank-0.bin"));
}

TEST_F(Cli, MissingDataFileIsAClearError) {
  Result r = chorus::test::run(std::string(CHORUS_TRAINER) + " --data " + (dir_ / "nope.txt").string() + " --out " +
                               (dir_ / "run").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("cannot read data '" + (dir_ / "nope.txt").string() + "'"), std::string::npos) << r.out;
}

TEST_F(Cli, ModelThatDoesNotDivideOverTheRanksIsAClearError) {
  Result r = trainer(2, "run", "--experts 3 --steps 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--experts 3 do not divide over 2 ranks"), std::string::npos) << r.out;
  r = trainer(2, "run", "--batch 3 --steps 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--batch 3 sequences do not divide over 2 ranks"), std::string::npos) << r.out;
  r = trainer(0, "run", "--d-model 30 --heads 4 --steps 2");
  EXPECT_EQ(r.code, 2) << r.out;  // a usage error, as every flag the run cannot take
  EXPECT_NE(r.out.find("--d-model 30 is not a multiple of --heads 4"), std::string::npos) << r.out;
}

TEST_F(Cli, CheckpointOfAnotherModelIsAClearError) {
  Result r = trainer(0, "run", "--steps 2 --ckpt-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  r = trainer(0, "run", "--steps 4 --resume --d-ff 96");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is of another model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("d_ff=64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("d_ff=96"), std::string::npos) << r.out;
  // Another number of ranks cannot take the shards either.
  r = trainer(2, "run", "--steps 4 --resume");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("holds shards of 1 ranks"), std::string::npos) << r.out;
  // A fresh start would mix with the old checkpoints: refused without --overwrite.
  r = trainer(0, "run", "--steps 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--overwrite"), std::string::npos) << r.out;
}

TEST_F(Cli, OptionsForLaterIssuesSayNotSupportedYet) {
  Result r = trainer(0, "run", "--device cuda");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("not supported yet"), std::string::npos) << r.out;
}

TEST_F(Cli, CompressTakesACodecAndNeedsSeveralRanks) {
  Result r = trainer(0, "run", "--compress int3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("expected int8, fp8_e4m3 or int4"), std::string::npos) << r.out;
  r = trainer(0, "run", "--compress int8 --steps 2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("needs several ranks"), std::string::npos) << r.out;
  r = trainer(2, "run", "--compress int8 --steps 3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("gradients int8 (quantize-once)"), std::string::npos) << r.out;
}

// Two runs into one --out would publish over each other's checkpoints (helper-77 saw one run's step directories
// hold the other's files): rank 0 holds <out>/lock for the run, and a second run is refused naming the holder.
TEST_F(Cli, ASecondRunIntoTheSameOutIsRefusedNamingTheFirst) {
  fs::create_directories(dir_ / "run");
  const int fd = ::open((dir_ / "run/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);  // the pid a run writes there
  for (int n : {0, 2}) {
    Result r = trainer(n, "run", "--steps 2 --ckpt-every 1");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("is in use by another run (process 4242 holds " + (dir_ / "run/lock").string()),
              std::string::npos)
        << r.out;
    EXPECT_FALSE(fs::exists(dir_ / "run/checkpoints")) << r.out;
  }
  ::close(fd);  // the first run ended: its lock goes with it
  Result r = trainer(2, "run", "--steps 2 --ckpt-every 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir_ / "run/checkpoints/step-00000002/meta.txt"));
  // A run that fails before writing anything leaves no directory behind.
  r = trainer(0, "fresh", "--steps 2 --resume");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--resume: no checkpoint"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "fresh"));
}

// The Chorus settings that may change the collectives' summation order are recorded; a resume under others trains
// on but says so (helper-77: CHORUS_NCHANNELS=2 changed the losses' last bits silently).
TEST_F(Cli, ResumingUnderOtherChorusSettingsIsSaid) {
  Result r = trainer(2, "run", "--steps 2 --ckpt-every 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string resume = tiny() + " --out " + (dir_ / "run").string() + " --resume --ckpt-every 1";
  r = chorus::test::run("CHORUS_NCHANNELS=2 " + launch(2) + resume + " --steps 3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: resuming under other Chorus settings: CHORUS_NCHANNELS=2 (checkpoint: unset);"),
            std::string::npos)
      << r.out;
  EXPECT_NE(file("run/checkpoints/step-00000003/meta.txt").find("\ncollectives CHORUS_NCHANNELS=2\n"),
            std::string::npos);
  r = chorus::test::run("CHORUS_NCHANNELS=2 " + launch(2) + resume + " --steps 4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("resuming under other Chorus settings"), std::string::npos) << r.out;
}

TEST_F(Cli, EmptyPathsAMalformedKillAtAndAnOversizedModelNameTheirFlags) {
  // An empty --resume-from (an unset shell variable) started afresh, exit 0; an empty --out ran at the file
  // system's root; --kill-at 0:2x was taken as 0:2 (helper-77).
  for (const char* flags : {"--out ''", "--resume-from ''", "--kill-at 0:2x", "--kill-at 0:2:later", "--kill-at 0"}) {
    Result r = trainer(0, "run", flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    const std::string flag = std::string(flags).substr(0, std::string(flags).find(' '));
    EXPECT_NE(r.out.find(flag + ":"), std::string::npos) << flags << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir_ / "run"));
  // A model whose state cannot fit in the machine's memory is refused before anything is allocated, naming the
  // flags that size it (it printed "std::bad_alloc", or could be let through by overcommit and killed later).
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (ram > 400e9) GTEST_SKIP() << "this machine could hold the 430 GiB model";
  Result huge = trainer(0, "huge", "--d-model 60000 --heads 1");
  EXPECT_EQ(huge.code, 2) << huge.out;
  EXPECT_NE(huge.out.find("the model (--d-model, --layers, --d-ff, --experts, --d-expert) has 2.88e+10 parameters"),
            std::string::npos)
      << huge.out;
  EXPECT_NE(huge.out.find("GiB of memory"), std::string::npos) << huge.out;
  EXPECT_FALSE(fs::exists(dir_ / "huge"));
  // One that fits the machine but not the process's address space (here a 2 GB limit: 0.4 G parameters) fails its
  // allocation with a message naming them too. Skipped where the machine itself has too little memory for it.
  if (ram < 8e9) return;
  Result big = chorus::test::run("ulimit -v 2000000; CHORUS_TIMEOUT_MS=30000 " + tiny() +
                                 " --d-model 4096 --heads 1 --out " + (dir_ / "big").string());
  EXPECT_EQ(big.code, 1) << big.out;
  EXPECT_NE(big.out.find("out of memory: the model or batch is too large for this machine (see --d-model"),
            std::string::npos)
      << big.out;
}

TEST_F(Cli, NonsensicalHyperParametersAreRefusedNamingTheFlag) {
  // --lr 1e30 used to train to NaN and exit 0; --eval-seqs below --batch gave a wrong "split too small" error.
  for (const char* flags : {"--lr -1", "--lr 1e30", "--min-lr 1", "--warmup -5", "--clip -1", "--weight-decay -10",
                            "--aux-weight -1", "--eval-seqs 2 --batch 8"}) {
    Result r = trainer(0, "run", flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    const std::string flag = std::string(flags).substr(0, std::string(flags).find(' '));
    EXPECT_NE(r.out.find(flag), std::string::npos) << flags << ": " << r.out;
  }
  // Flags that parse but describe a run that cannot be are usage errors too (exit 2), found before training;
  // a negative --shard-group and a --kill-at rank outside the run used to be taken silently.
  for (const char* flags : {"--steps -1", "--top-k 9", "--shard-group -2", "--kill-at 5:1", "--kill-at -1:3",
                            "--seq-len -5", "--val-fraction 0", "--val-fraction 2", "--seed -1", "--shard-group 2",
                            "--hybrid", "--moe-every 0", "--d-model -8"}) {
    Result r = trainer(0, "run", flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    const std::string flag = std::string(flags).substr(0, std::string(flags).find(' '));
    EXPECT_NE(r.out.find(flag), std::string::npos) << flags << ": " << r.out;
  }
  // A peak rate below the default final rate (3e-4) takes the final rate down with it.
  Result r = trainer(0, "run", "--lr 1e-4 --steps 1");
  EXPECT_EQ(r.code, 0) << r.out;
}

}  // namespace
