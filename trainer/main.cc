// chorus-trainer: trains a small byte-level transformer language model, with FSDP (ZeRO-3) and expert-parallel
// MoE over Chorus when a launcher starts it (`chorusrun -n 4 chorus-trainer`), or unsharded in one process when
// run directly. Prints one line per step, a summary, and writes loss.png (gnuplot) next to the run's checkpoints.
// docs/trainer.md describes what it does and what it measured.
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chorus/chorus.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "trainer/data.h"
#include "trainer/dist.h"
#include "trainer/ops.h"
#include "trainer/trainer.h"

namespace {

namespace fs = std::filesystem;
using namespace trainer;

constexpr int kExitFailed = 1, kExitUsage = 2;
// The flags that size the model and its activations (named when an allocation fails).
constexpr const char* kSizeFlags = "--d-model, --d-ff, --layers, --experts, --d-expert, --batch, --seq-len";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  TrainConfig train;
  std::string data = kDefaultCorpus;
  double val_fraction = 0.1;
  int eval_every = 50;
  bool hybrid = false;
  int shard_group = 0;
  std::string out = "trainer-run";
  int ckpt_every = 100, keep = 2;
  bool resume = false, overwrite = false, plot = true;
  std::string resume_from;
  // Fault injection for the tests: rank kill_rank SIGKILLs itself in step kill_step (after its backward, before
  // the optimizer), or halfway through writing its file of the checkpoint at that step.
  int kill_rank = -1, kill_step = -1;
  bool kill_in_checkpoint = false;
};

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: chorus-trainer [options]          (one process, unsharded)\n"
      "       chorusrun -n N chorus-trainer [options]   (N ranks: FSDP + expert parallelism)\n"
      "data:\n"
      "  --data PATH            text file, or directory of text files (default %s)\n"
      "  --val-fraction F       share of the text held out for validation (default 0.1)\n"
      "model:\n"
      "  --seq-len T            context in bytes (default 64)\n"
      "  --d-model D  --layers L  --heads H  --d-ff F     (defaults 128, 4, 4, 512)\n"
      "  --experts E            experts per MoE block, 0 for a dense model (default 4)\n"
      "  --top-k K  --capacity-factor C  --d-expert F  --moe-every M   (defaults 2, 1.25, 256, 2)\n"
      "training:\n"
      "  --steps S  --batch B   optimizer steps, global batch in sequences (defaults 300, 16)\n"
      "  --lr LR  --min-lr LR  --warmup W   peak and final learning rate, warm-up steps (3e-3, 3e-4, 30)\n"
      "  --weight-decay W  --clip G  --aux-weight A  --seed S   (0.1, 1.0, 0.01, 1)\n"
      "  --eval-every N         validation every N steps and at the end (default 50; 0: only at the end)\n"
      "  --eval-seqs N          validation windows (default 128)\n"
      "parallelism (under a launcher):\n"
      "  --shard-group G        shard over groups of G consecutive ranks, replicate across groups (HSDP)\n"
      "  --hybrid               shard inside each host, replicate across hosts\n"
      "  --no-prefetch          blocking all-gathers and reduce-scatters (no overlap), for comparison\n"
      "  --compress CODEC       gradients reduce-scattered compressed: int8, fp8_e4m3 or int4 (quantize-once;\n"
      "                         parameters are all-gathered in fp32)\n"
      "  --device cpu|cuda      where to compute (cuda: not supported yet)\n"
      "output and checkpoints:\n"
      "  --out DIR              run directory: checkpoints/, loss.tsv, loss.png (default trainer-run)\n"
      "  --ckpt-every N         checkpoint every N steps and at the end (default 100; 0: never)\n"
      "  --keep K               checkpoints kept (default 2)\n"
      "  --resume               continue from the newest checkpoint in DIR/checkpoints\n"
      "  --resume-from CKPT     continue from the checkpoint directory CKPT\n"
      "  --overwrite            start afresh although DIR holds checkpoints; with --resume-from, delete DIR's\n"
      "                         checkpoints after the one resumed from (else refused)\n"
      "  --no-plot              do not run gnuplot\n"
      "testing:\n"
      "  --kill-at R:S[:checkpoint]  rank R SIGKILLs itself in step S (or while writing checkpoint S)\n",
      kDefaultCorpus);
}

template <typename T>
T parse_number(const char* opt, const char* text) {
  std::istringstream in(text);
  T v{};
  in >> v;
  if (!in || !in.eof()) throw UsageError(std::string("--") + opt + ": '" + text + "' is not a number");
  // Streams read "-1" into an unsigned type as its wrap-around.
  if (std::is_unsigned_v<T> && std::string(text).find('-') != std::string::npos)
    throw UsageError(std::string("--") + opt + ": '" + text + "' must be >= 0");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  ModelConfig& m = o.train.model;
  m.n_experts = 4;
  enum : int {
    kData = 256,
    kValFraction,
    kSeqLen,
    kDModel,
    kLayers,
    kHeads,
    kDff,
    kExperts,
    kTopK,
    kCapacity,
    kDExpert,
    kMoeEvery,
    kSteps,
    kBatch,
    kLr,
    kMinLr,
    kWarmup,
    kWd,
    kClip,
    kAux,
    kSeed,
    kEvalEvery,
    kEvalSeqs,
    kShardGroup,
    kHybrid,
    kNoPrefetch,
    kCompress,
    kDevice,
    kOut,
    kCkptEvery,
    kKeep,
    kResume,
    kResumeFrom,
    kOverwrite,
    kNoPlot,
    kKillAt,
    kHelp
  };
  static const option opts[] = {
      {"data", required_argument, nullptr, kData},
      {"val-fraction", required_argument, nullptr, kValFraction},
      {"seq-len", required_argument, nullptr, kSeqLen},
      {"d-model", required_argument, nullptr, kDModel},
      {"layers", required_argument, nullptr, kLayers},
      {"heads", required_argument, nullptr, kHeads},
      {"d-ff", required_argument, nullptr, kDff},
      {"experts", required_argument, nullptr, kExperts},
      {"top-k", required_argument, nullptr, kTopK},
      {"capacity-factor", required_argument, nullptr, kCapacity},
      {"d-expert", required_argument, nullptr, kDExpert},
      {"moe-every", required_argument, nullptr, kMoeEvery},
      {"steps", required_argument, nullptr, kSteps},
      {"batch", required_argument, nullptr, kBatch},
      {"lr", required_argument, nullptr, kLr},
      {"min-lr", required_argument, nullptr, kMinLr},
      {"warmup", required_argument, nullptr, kWarmup},
      {"weight-decay", required_argument, nullptr, kWd},
      {"clip", required_argument, nullptr, kClip},
      {"aux-weight", required_argument, nullptr, kAux},
      {"seed", required_argument, nullptr, kSeed},
      {"eval-every", required_argument, nullptr, kEvalEvery},
      {"eval-seqs", required_argument, nullptr, kEvalSeqs},
      {"shard-group", required_argument, nullptr, kShardGroup},
      {"hybrid", no_argument, nullptr, kHybrid},
      {"no-prefetch", no_argument, nullptr, kNoPrefetch},
      {"compress", required_argument, nullptr, kCompress},
      {"device", required_argument, nullptr, kDevice},
      {"out", required_argument, nullptr, kOut},
      {"ckpt-every", required_argument, nullptr, kCkptEvery},
      {"keep", required_argument, nullptr, kKeep},
      {"resume", no_argument, nullptr, kResume},
      {"resume-from", required_argument, nullptr, kResumeFrom},
      {"overwrite", no_argument, nullptr, kOverwrite},
      {"no-plot", no_argument, nullptr, kNoPlot},
      {"kill-at", required_argument, nullptr, kKillAt},
      {"help", no_argument, nullptr, kHelp},
      {nullptr, 0, nullptr, 0},
  };
  opterr = 0;
  bool min_lr_given = false, eval_seqs_given = false;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, nullptr)) != -1) {
    const char* name = c >= kData && c < kHelp ? opts[c - kData].name : "";
    auto num_i = [&] { return parse_number<int>(name, optarg); };
    auto num_f = [&] { return parse_number<float>(name, optarg); };
    switch (c) {
      case kData: o.data = optarg; break;
      case kValFraction: o.val_fraction = parse_number<double>(name, optarg); break;
      case kSeqLen: m.seq_len = num_i(); break;
      case kDModel: m.d_model = num_i(); break;
      case kLayers: m.n_layers = num_i(); break;
      case kHeads: m.n_heads = num_i(); break;
      case kDff: m.d_ff = num_i(); break;
      case kExperts: m.n_experts = num_i(); break;
      case kTopK: m.top_k = num_i(); break;
      case kCapacity: m.capacity_factor = num_f(); break;
      case kDExpert: m.d_expert = num_i(); break;
      case kMoeEvery: m.moe_every = num_i(); break;
      case kSteps: o.train.steps = num_i(); break;
      case kBatch: o.train.batch = num_i(); break;
      case kLr: o.train.lr = num_f(); break;
      case kMinLr:
        o.train.min_lr = num_f();
        min_lr_given = true;
        break;
      case kWarmup: o.train.warmup = num_i(); break;
      case kWd: o.train.adam.weight_decay = num_f(); break;
      case kClip: o.train.clip = num_f(); break;
      case kAux: o.train.aux_weight = num_f(); break;
      case kSeed: o.train.seed = parse_number<uint64_t>(name, optarg); break;
      case kEvalEvery: o.eval_every = num_i(); break;
      case kEvalSeqs:
        o.train.eval_seqs = num_i();
        eval_seqs_given = true;
        break;
      case kShardGroup: o.shard_group = num_i(); break;
      case kHybrid: o.hybrid = true; break;
      case kNoPrefetch: o.train.prefetch = false; break;
      case kCompress:
        o.train.compress = optarg;
        if (o.train.compress != "int8" && o.train.compress != "fp8_e4m3" && o.train.compress != "int4")
          throw UsageError("--compress " + o.train.compress + ": expected int8, fp8_e4m3 or int4");
        break;
      case kDevice:
        if (std::string(optarg) == "cuda")
          throw UsageError(
              "--device cuda: not supported yet: the trainer's GPU path (cuBLAS, device buffers) comes with Chorus's "
              "CUDA support (the CUDA issue); this build computes on the CPU with OpenBLAS");
        if (std::string(optarg) != "cpu")
          throw UsageError("--device: '" + std::string(optarg) + "' is not cpu or cuda");
        break;
      case kOut:
        if (*optarg == '\0') throw UsageError("--out: empty path (the run directory)");
        o.out = optarg;
        break;
      case kCkptEvery: o.ckpt_every = num_i(); break;
      case kKeep: o.keep = num_i(); break;
      case kResume: o.resume = true; break;
      case kResumeFrom:
        // An unset shell variable ("--resume-from $CKPT") must not start afresh.
        if (*optarg == '\0') throw UsageError("--resume-from: empty path (a checkpoint directory)");
        o.resume_from = optarg;
        break;
      case kOverwrite: o.overwrite = true; break;
      case kNoPlot: o.plot = false; break;
      case kKillAt: {
        const std::string v = optarg;
        const size_t colon = v.find(':'), second = v.find(':', colon == std::string::npos ? v.size() : colon + 1);
        const std::string where = second == std::string::npos ? "" : v.substr(second + 1);
        try {
          if (colon == std::string::npos || (second != std::string::npos && where != "checkpoint"))
            throw UsageError("");
          o.kill_rank = parse_number<int>("kill-at", v.substr(0, colon).c_str());
          o.kill_step = parse_number<int>("kill-at", v.substr(colon + 1, second - colon - 1).c_str());
        } catch (const UsageError&) {
          throw UsageError("--kill-at: '" + v + "' is not RANK:STEP or RANK:STEP:checkpoint");
        }
        o.kill_in_checkpoint = !where.empty();
        break;
      }
      case kHelp:
      case 'h': usage(stdout); std::exit(0);
      default: throw UsageError(std::string("unknown or incomplete option '") + argv[optind - 1] + "' (see --help)");
    }
  }
  if (optind < argc) throw UsageError(std::string("unexpected argument '") + argv[optind] + "' (see --help)");
  if (o.shard_group < 0) throw UsageError("--shard-group must be >= 0 (0: shard over every rank)");
  if (o.hybrid && o.shard_group > 0) throw UsageError("--hybrid and --shard-group exclude each other");
  if (o.kill_step != -1 && (o.kill_rank < 0 || o.kill_step < 1))
    throw UsageError("--kill-at: the rank must be >= 0 and the step >= 1");
  if (o.eval_every < 0 || o.ckpt_every < 0 || o.keep < 1)
    throw UsageError("--eval-every and --ckpt-every must be >= 0, --keep >= 1");
  // Checked here, before the corpus is cut into windows of --seq-len + 1 bytes.
  if (m.seq_len < 2) throw UsageError("--seq-len must be at least 2 (got " + std::to_string(m.seq_len) + ")");
  if (!(o.val_fraction > 0 && o.val_fraction < 1))
    throw UsageError("--val-fraction " + (std::ostringstream() << o.val_fraction).str() +
                     " must be between 0 and 1 (exclusive)");
  // Defaults follow the flags they depend on: the final rate never above the peak, validation at least one batch.
  if (!min_lr_given) o.train.min_lr = std::min(o.train.min_lr, o.train.lr);
  if (!eval_seqs_given) o.train.eval_seqs = std::max(o.train.eval_seqs, o.train.batch);
  const TrainConfig& t = o.train;
  if (!(t.lr > 0) || !std::isfinite(t.lr) || t.lr > 10)
    throw UsageError("--lr " + std::to_string(t.lr) + " must be in (0, 10]");
  if (!(t.min_lr >= 0) || t.min_lr > t.lr)
    throw UsageError("--min-lr " + std::to_string(t.min_lr) + " must be in [0, --lr]");
  if (t.warmup < 0) throw UsageError("--warmup must be >= 0");
  if (!(t.clip >= 0) || !std::isfinite(t.clip)) throw UsageError("--clip must be >= 0 (0: no clipping)");
  if (!(t.adam.weight_decay >= 0) || !std::isfinite(t.adam.weight_decay))
    throw UsageError("--weight-decay must be >= 0");
  if (!(t.aux_weight >= 0) || !std::isfinite(t.aux_weight)) throw UsageError("--aux-weight must be >= 0");
  if (t.batch > 0 && t.eval_seqs < t.batch)
    throw UsageError("--eval-seqs " + std::to_string(t.eval_seqs) + " must be at least --batch " +
                     std::to_string(t.batch) + " (validation runs whole global batches)");
  return o;
}

// Under a launcher (chorusrun, torchrun, mpirun, srun) with more than one process?
bool launched() {
  if (std::getenv("CHORUS_RANK")) return true;
  static const std::pair<const char*, const char*> kVars[] = {
      {"RANK", "WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}};
  for (const auto& [r, s] : kVars)
    if (std::getenv(r) && std::getenv(s) && std::atoi(std::getenv(s)) > 1) return true;
  return std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_NTASKS") && std::atoi(std::getenv("SLURM_NTASKS")) > 1;
}

// This host's identity (host name, boot, network namespace), so that ranks can tell which of them share a host.
uint64_t host_identity() {
  std::string id;
  char name[256] = "";
  gethostname(name, sizeof(name) - 1);
  id += name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string b;
  std::getline(boot, b);
  id += "|" + b;
  std::error_code ec;
  id += "|" + fs::read_symlink("/proc/self/ns/net", ec).string();
  uint64_t h = 0;
  for (unsigned char ch : id) h = hash_combine(h, ch);
  return h;
}

// Every rank's host_identity(), in rank order (collective).
std::vector<uint64_t> host_identities(chorus::Comm& world) {
  const uint64_t mine = host_identity();
  std::vector<uint64_t> all(world.size());
  world.all_gather(std::span<const uint64_t>(&mine, 1), std::span<uint64_t>(all));
  return all;
}

// --hybrid: ranks per host, which must come in equal blocks of consecutive ranks.
int ranks_per_host(chorus::Comm& world) {
  const std::vector<uint64_t> all = host_identities(world);
  int g = 1;
  while (g < int(all.size()) && all[g] == all[0]) ++g;
  for (size_t i = 0; i < all.size(); ++i)
    if (int(all.size()) % g != 0 || all[i] != all[i / g * g] || (i % g == 0 && i > 0 && all[i] == all[i - 1]))
      throw std::invalid_argument(
          "--hybrid needs the same number of ranks on every host, in blocks of consecutive "
          "ranks (use --shard-group G to choose the groups yourself)");
  return g;
}

std::string mb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f MB", bytes / 1e6);
  return b;
}

// Writes loss.tsv and val.tsv from the history and plots them into loss.png with gnuplot.
void write_plot(const std::string& dir, const std::vector<HistoryRow>& history, double unigram, bool plot,
                const std::string& title) {
  {
    std::ofstream loss(dir + "/loss.tsv"), val(dir + "/val.tsv");
    loss << "# step\ttrain_loss\n";
    val << "# step\tval_loss\n";
    char line[64];
    for (const HistoryRow& h : history) {
      std::snprintf(line, sizeof(line), "%d\t%.9g\n", h.step, h.loss);
      loss << line;
      if (h.val >= 0) {
        std::snprintf(line, sizeof(line), "%d\t%.9g\n", h.step, h.val);
        val << line;
      }
    }
    // A full disk or an unwritable directory must not pass for a written curve.
    for (auto [f, name] : {std::pair{&loss, "/loss.tsv"}, std::pair{&val, "/val.tsv"}}) {
      f->close();
      if (!*f) throw std::runtime_error("cannot write '" + dir + name + "' (disk full, or not writable?)");
    }
  }
  if (!plot || history.empty()) return;
  for (const char* terminal : {"pngcairo", "png"}) {
    {
      std::ofstream gp(dir + "/loss.gp");
      gp << "set terminal " << terminal << " size 900,540\n"
         << "set output 'loss.png'\n"
         << "set title \"" << title << "\" noenhanced\n"
         << "set xlabel 'step'\nset ylabel 'loss (nats per byte)'\nset grid\nset key top right\n"
         << "plot 'loss.tsv' using 1:2 with lines lw 1 lc rgb '#7f9fcf' title 'training (batch)', \\\n"
         << "     'val.tsv' using 1:2 with linespoints lw 2 pt 7 lc rgb '#c03030' title 'validation', \\\n"
         << "     " << unigram << " with lines dt 2 lw 2 lc rgb '#404040' title 'unigram baseline'\n";
    }
    const pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir.c_str()) != 0) _exit(127);
      const int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, 2);
      execlp("gnuplot", "gnuplot", "loss.gp", static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 127) {
      std::printf("plot: gnuplot not found (Debian: gnuplot-nox); the curve is in %s/loss.tsv\n", dir.c_str());
      return;
    }
  }
  std::printf("plot: gnuplot failed; the curve is in %s/loss.tsv\n", dir.c_str());
}

// An absolute path without . or .. parts, symlinks resolved where they exist: two spellings of one directory compare
// equal, one relative path under two working directories does not.
std::string absolute_path(const std::string& p) {
  if (p.empty()) return p;
  std::error_code ec;
  const fs::path a = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal().string() : a.string();
}

// Every option but --data as "name value", paths absolute: what every rank of a run must share.
std::vector<std::pair<std::string, std::string>> option_lines(const Options& o) {
  const TrainConfig& t = o.train;
  auto f = [](double v) {
    char b[40];
    std::snprintf(b, sizeof(b), "%a", v);  // exact
    return std::string(b);
  };
  // --data is left out: hosts may keep the same text at different paths, and what the ranks read is compared itself
  // (agree_on_checkpoints).
  return {{"--val-fraction", f(o.val_fraction)},
          {"model (--seq-len, --d-model, ...)", t.model.describe()},
          {"--steps", std::to_string(t.steps)},
          {"--batch", std::to_string(t.batch)},
          {"--lr", f(t.lr)},
          {"--min-lr", f(t.min_lr)},
          {"--warmup", std::to_string(t.warmup)},
          {"--weight-decay", f(t.adam.weight_decay)},
          {"--clip", f(t.clip)},
          {"--aux-weight", f(t.aux_weight)},
          {"--seed", std::to_string(t.seed)},
          {"--eval-every", std::to_string(o.eval_every)},
          {"--eval-seqs", std::to_string(t.eval_seqs)},
          {"--shard-group", std::to_string(o.shard_group)},
          {"--hybrid", std::to_string(o.hybrid)},
          {"--no-prefetch", std::to_string(!t.prefetch)},
          {"--compress", t.compress},
          {"--out", absolute_path(o.out)},
          {"--ckpt-every", std::to_string(o.ckpt_every)},
          {"--keep", std::to_string(o.keep)},
          {"--resume", std::to_string(o.resume)},
          {"--resume-from", absolute_path(o.resume_from)},
          {"--overwrite", std::to_string(o.overwrite)},
          {"--kill-at", std::to_string(o.kill_rank) + ":" + std::to_string(o.kill_step) +
                            (o.kill_in_checkpoint ? ":checkpoint" : "")}};
}

// Ranks started with other options would train different things together, or wait in a barrier the others skip:
// every rank's options are compared with rank 0's (--plot aside), and the first that differs is named.
void agree_on_options(chorus::Comm& world, const Options& o) {
  const auto lines = option_lines(o);
  std::vector<uint64_t> mine;
  for (const auto& [name, value] : lines) mine.push_back(fnv1a(value));
  std::vector<uint64_t> all(mine.size() * size_t(world.size()));
  world.all_gather(std::span<const uint64_t>(mine), std::span<uint64_t>(all));
  for (size_t r = 1; r < size_t(world.size()); ++r)
    for (size_t i = 0; i < mine.size(); ++i)
      if (all[r * mine.size() + i] != all[i])
        throw std::invalid_argument("rank " + std::to_string(r) + " was started with another " + lines[i].first +
                                    " than rank 0" + (world.rank() == 0 ? " (rank 0: '" + lines[i].second + "')" : "") +
                                    ": every rank needs the same options (paths are compared as absolute paths)");
}

// Ranks that read other text (a relative --data, or files that differ between hosts) or see other checkpoints (a
// file system not shared) would train apart, or some would wait in a barrier that others skip: compared with rank
// 0's before anything is deleted or loaded.
void agree_on_checkpoints(chorus::Comm& world, const Trainer& trainer, const std::string& ckpt_root,
                          const std::string& resume_dir) {
  std::string seen;
  for (const std::string& p : checkpoints_after(ckpt_root, -1)) seen += fs::path(p).filename().string() + " ";
  std::string resumed;
  int step = -1;
  if (!resume_dir.empty()) {
    std::ifstream meta(resume_dir + "/meta.txt", std::ios::binary);
    resumed = (std::ostringstream() << meta.rdbuf()).str();
    step = read_meta(resume_dir).step;
  }
  const uint64_t mine[4] = {fnv1a(trainer.training_settings()), fnv1a(seen), fnv1a(resumed), uint64_t(int64_t(step))};
  std::vector<uint64_t> all(4 * size_t(world.size()));
  world.all_gather(std::span<const uint64_t>(mine, 4), std::span<uint64_t>(all));
  for (size_t r = 1; r < size_t(world.size()); ++r) {
    const uint64_t* theirs = all.data() + 4 * r;
    const std::string who = "rank " + std::to_string(r);
    if (theirs[0] != all[0])
      throw std::runtime_error(who +
                               " reads another text than rank 0 from --data (do the files differ between "
                               "hosts?)");
    if (theirs[3] != all[3])
      throw std::runtime_error("rank 0 resumes from step " + std::to_string(int64_t(all[3])) + " but " + who +
                               " from step " + std::to_string(int64_t(theirs[3])) +
                               ": every rank must see the same checkpoints (a shared file system)");
    if (theirs[1] != all[1] || theirs[2] != all[2])
      throw std::runtime_error(who + " sees other checkpoints under '" + ckpt_root +
                               "' than rank 0: every rank must see the same checkpoints (a shared file system)");
  }
}

// A model whose state cannot fit is refused before anything is allocated: an allocation the kernel's overcommit lets
// through would be killed later, or swap the machine to a standstill (helper-77). A rank holds fp32 parameters,
// gradients and two AdamW moments of its dense shard (FSDP over its shard group) and of its experts (over every
// rank); the ranks on one host share its memory. Every rank stops alike when any host is short (collective when
// `world` is set). Throws std::invalid_argument.
void refuse_state_beyond_memory(const ModelConfig& mc, const Dist& dist, chorus::Comm* world) {
  mc.validate();  // the sizes below must be sane first (--moe-every 0 divided by zero)
  double dense = 0, experts = 0;
  for (const Unit& u : make_layout(mc)) dense += double(u.numel);
  for (int l = 0; l < mc.n_layers; ++l)
    if (mc.is_moe_block(l)) experts += double(mc.n_experts) * 2.0 * mc.d_model * mc.d_expert;  // MoeLayer's
  int here = 1;
  if (world) {
    const std::vector<uint64_t> all = host_identities(*world);
    here = int(std::count(all.begin(), all.end(), all[size_t(world->rank())]));
  }
  const double per_rank = 16.0 * (dense / dist.shard_size() + experts / dist.nranks());
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  int short_hosts = per_rank * here > ram;
  if (world) world->all_reduce(std::span<int>(&short_hosts, 1), chorus::Op::Sum);
  if (per_rank * here > ram) {
    char text[400];
    std::snprintf(text, sizeof(text),
                  "the model (--d-model, --layers, --d-ff, --experts, --d-expert) has %.3g parameters: their state "
                  "(fp32 parameters, gradients and AdamW moments) needs %.1f GiB per rank, %.1f GiB for the %d "
                  "rank(s) on this host, more than its %.1f GiB of memory",
                  dense + experts, per_rank / (1 << 30), per_rank * here / (1 << 30), here, ram / (1 << 30));
    throw std::invalid_argument(text);
  }
  if (short_hosts > 0)
    throw std::invalid_argument(
        "the model's state does not fit another host's memory (its ranks' errors say how much)");
}

// One run per --out at a time: two would publish over each other's checkpoints (helper-77). Rank 0 holds an
// exclusive flock on <out>/lock, with its pid inside, for the whole run; the kernel releases it when the process
// ends, killed or not. Taking it also finds an --out that cannot be written before any training. A directory this
// lock created and nothing else used is removed again when the run fails before writing anything.
class RunLock {
 public:
  explicit RunLock(const std::string& out) : out_(out), created_(!fs::exists(out)) {
    fs::create_directories(out);
    const std::string path = out + "/lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw std::runtime_error("--out: cannot create '" + path + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char text[32] = {};
      const ssize_t n = ::pread(fd_, text, sizeof(text) - 1, 0);
      ::close(fd_);
      std::string holder = n > 0 ? std::string(text, size_t(n)) : "?";
      if (!holder.empty() && holder.back() == '\n') holder.pop_back();
      if (err != EWOULDBLOCK) throw std::runtime_error("--out: cannot lock '" + path + "': " + std::strerror(err));
      throw std::runtime_error("--out: '" + out + "' is in use by another run (process " + holder + " holds " + path +
                               "): wait for it to end, or pass another --out");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
      const int err = errno;
      ::close(fd_);  // the lock with it: this run does not go on
      throw std::runtime_error("--out: cannot write '" + path + "': " + std::strerror(err));
    }
  }
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock() {
    std::error_code ec;
    size_t entries = 0;
    bool only_lock = true;
    for (const auto& e : fs::directory_iterator(out_, ec)) {
      ++entries;
      only_lock &= e.path().filename() == "lock";
    }
    if (created_ && !ec && entries == 1 && only_lock) fs::remove_all(out_, ec);  // the run failed before writing
    ::close(fd_);
  }

 private:
  std::string out_;
  bool created_;
  int fd_ = -1;
};

int run(const Options& o) {
  blas_init();
  std::unique_ptr<chorus::Comm> world;
  if (launched()) world = std::make_unique<chorus::Comm>(chorus::Comm::from_env());
  const int rank = world ? world->rank() : 0;
  const bool lead = rank == 0;

  if (!world && (o.shard_group > 0 || o.hybrid))
    throw std::invalid_argument(std::string(o.hybrid ? "--hybrid" : "--shard-group") +
                                " shards over several ranks: run under a launcher (chorusrun -n N)");
  if (world) agree_on_options(*world, o);
  if (o.kill_rank >= (world ? world->size() : 1))
    throw std::invalid_argument("--kill-at: rank " + std::to_string(o.kill_rank) + " is not a rank of this run (" +
                                std::to_string(world ? world->size() : 1) + " rank(s))");
  int shard_group = o.shard_group;
  if (o.hybrid && world) shard_group = ranks_per_host(*world);
  Dist dist = world ? Dist(*world, shard_group) : Dist();

  refuse_state_beyond_memory(o.train.model, dist, world.get());
  const Corpus corpus = Corpus::load(o.data, o.val_fraction, size_t(o.train.model.seq_len) + 1);
  Trainer trainer(o.train, corpus, dist);
  const double unigram = unigram_baseline(corpus);

  const std::string ckpt_root = o.out + "/checkpoints";
  for (const std::string& d : {o.out, ckpt_root})
    if (fs::exists(d) && !fs::is_directory(d))
      throw std::runtime_error("'" + d + "' exists and is not a directory (see --out)");
  std::optional<RunLock> lock;
  std::string lock_error;
  if (lead) {
    try {
      lock.emplace(o.out);
    } catch (const std::exception& e) {
      lock_error = e.what();
    }
  }
  if (world) {  // the other ranks stop too, before they look at the checkpoints
    int failed = !lock_error.empty();
    world->broadcast(std::span<int>(&failed, 1), 0);
    if (failed && !lead) throw std::runtime_error("rank 0 could not take --out '" + o.out + "' (its error says why)");
  }
  if (!lock_error.empty()) throw std::runtime_error(lock_error);
  if (lead) fs::remove_all(ckpt_root + ".del");  // what a killed --overwrite left
  std::string resume_dir = o.resume_from;
  if (o.resume && resume_dir.empty()) {
    resume_dir = latest_checkpoint(ckpt_root);
    if (resume_dir.empty()) throw std::runtime_error("--resume: no checkpoint under '" + ckpt_root + "'");
  }
  // The trainer leaves no step directory without meta.txt (it publishes and deletes by renames): one is damage from
  // outside, or a kill under an older trainer, and is said before the next checkpoint removes it.
  if (lead)
    for (const std::string& d : incomplete_checkpoints(ckpt_root))
      std::fprintf(stderr,
                   "chorus-trainer: warning: '%s' has no meta.txt (cut short or damaged): not a checkpoint, passed "
                   "over; the next checkpoint written removes it\n",
                   d.c_str());
  if (world) agree_on_checkpoints(*world, trainer, ckpt_root, resume_dir);
  if (resume_dir.empty() && !latest_checkpoint(ckpt_root).empty()) {
    if (!o.overwrite)
      throw std::runtime_error("'" + ckpt_root + "' holds checkpoints of an earlier run: pass --resume to continue " +
                               "it, --overwrite to start afresh, or another --out");
    if (world) world->barrier();             // every rank has looked before rank 0 deletes
    if (lead) remove_checkpoint(ckpt_root);  // renamed away first: a kill leaves no torn checkpoint behind
  }
  if (!resume_dir.empty()) {
    // Checkpoints after the one resumed from, in the folder this run writes to, belong to the run it leaves: this
    // run's checkpoints would interleave with them, the newest kept would be theirs, and --resume would take the
    // stale newest. They are removed only when asked, and only once the resumed checkpoint has loaded.
    const int resume_step = read_meta(resume_dir).step;
    const std::vector<std::string> later = checkpoints_after(ckpt_root, resume_step);
    std::string names;
    for (const std::string& p : later) names += (names.empty() ? "" : ", ") + fs::path(p).filename().string();
    if (!later.empty() && !o.overwrite)
      throw std::runtime_error("'" + ckpt_root + "' holds checkpoints after the one resumed from (" + names +
                               "): pass --overwrite to delete them, or another --out");
    trainer.resume(resume_dir);
    if (!later.empty()) {
      if (world) world->barrier();  // every rank has loaded and looked before rank 0 deletes
      if (lead)
        for (auto p = later.rbegin(); p != later.rend(); ++p) {  // newest first: a kill leaves no gap
          remove_checkpoint(*p);
          remove_checkpoint(*p + ".old");  // a copy a kill left beside it, which would stand in for it
        }
    }
  }
  if (lead) fs::create_directories(o.out);

  const ModelConfig& m = o.train.model;
  const ParamStore::Memory mem = trainer.memory();
  const int N = dist.nranks();
  if (lead) {
    std::printf("chorus-trainer: %s\n", m.describe().c_str());
    std::printf("data: %s: %zu training bytes, %zu held out; unigram baseline %.4f nats/byte\n", corpus.source.c_str(),
                corpus.train.size(), corpus.val.size(), unigram);
    if (world)
      std::printf("parallel: %d ranks; FSDP shard groups of %d%s; %s; all-gather prefetch %s; gradients %s\n", N,
                  dist.shard_size(),
                  dist.replicas() > 1 ? (", " + std::to_string(dist.replicas()) + " replicas (hybrid)").c_str() : "",
                  m.n_experts ? (std::to_string(m.n_experts / N) + " expert(s) per rank").c_str() : "dense",
                  o.train.prefetch ? "on" : "off",
                  o.train.compress.empty() ? "fp32" : (o.train.compress + " (quantize-once)").c_str());
    else
      std::printf("parallel: one process, unsharded\n");
    std::printf("state per rank: params %s, grads %s, optimizer %s; gather buffers %s\n", mb(mem.params).c_str(),
                mb(mem.grads).c_str(), mb(mem.optimizer).c_str(), mb(mem.transient).c_str());
    std::printf("batch %d x %d bytes, %d steps%s\n", o.train.batch, m.seq_len, o.train.steps,
                resume_dir.empty() ? "" : (", resumed from " + resume_dir).c_str());
    std::fflush(stdout);
  }

  const auto t_start = std::chrono::steady_clock::now();
  const int first_step = trainer.step_count();
  const size_t tokens_per_step = size_t(o.train.batch) * m.seq_len;
  double comm_s = 0, last_val = -1, train_s = 0;
  uint64_t comm_bytes = 0, comm_calls = 0;
  std::string last_ckpt;
  while (trainer.step_count() < o.train.steps) {
    std::function<void()> die_mid_step;
    if (rank == o.kill_rank && trainer.step_count() + 1 == o.kill_step && !o.kill_in_checkpoint)
      die_mid_step = [] { raise(SIGKILL); };
    const Trainer::StepResult r = trainer.step(die_mid_step);
    comm_s += r.comm.seconds;
    comm_bytes += r.comm.bytes;
    comm_calls += r.comm.calls;
    train_s += r.seconds;
    if (lead) {
      std::printf("step %5d/%d  loss %.6f  aux %.4f  lr %.2e  |g| %.3f  %7.0f tok/s  comm %6.1f ms (%2.0f%%) %s\n",
                  r.step, o.train.steps, r.loss, r.aux, r.lr, r.grad_norm, tokens_per_step / r.seconds,
                  r.comm.seconds * 1e3, 100 * r.comm.seconds / r.seconds, mb(double(r.comm.bytes)).c_str());
      std::fflush(stdout);
    }
    const bool last = r.step == o.train.steps;
    if ((o.eval_every > 0 && r.step % o.eval_every == 0) || last) {
      last_val = trainer.evaluate();
      if (lead) {
        std::printf("eval  step %d: validation loss %.4f nats/byte (unigram baseline %.4f)\n", r.step, last_val,
                    unigram);
        std::fflush(stdout);
      }
    }
    if (o.ckpt_every > 0 && (r.step % o.ckpt_every == 0 || last)) {
      std::function<void()> die;
      if (rank == o.kill_rank && r.step == o.kill_step && o.kill_in_checkpoint) die = [] { raise(SIGKILL); };
      last_ckpt = trainer.save(ckpt_root, o.keep, die);
      if (lead) {
        std::printf("checkpoint: %s\n", last_ckpt.c_str());
        std::fflush(stdout);
      }
    }
  }

  if (lead) {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const auto& h = trainer.history();
    const int done = trainer.step_count() - first_step;
    double recent = 0;
    int nrecent = 0;
    for (size_t i = h.size() >= 10 ? h.size() - 10 : 0; i < h.size(); ++i, ++nrecent) recent += h[i].loss;
    if (last_val < 0)
      for (const HistoryRow& row : h)
        if (row.val >= 0) last_val = row.val;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("== summary\n");
    if (done > 0)
      std::printf("steps: %d run now (%d to %d), %zu tokens in %.1f s: %.0f tokens/s\n", done, first_step + 1,
                  trainer.step_count(), done * tokens_per_step, wall, done * tokens_per_step / train_s);
    else
      std::printf("steps: none to run (the run is at step %d of %d)\n", trainer.step_count(), o.train.steps);
    if (nrecent) std::printf("training loss (mean of the last %d steps): %.4f nats/byte\n", nrecent, recent / nrecent);
    if (last_val >= 0)
      std::printf("validation loss: %.4f nats/byte; unigram baseline %.4f (%.4f %s it)\n", last_val, unigram,
                  std::fabs(unigram - last_val), last_val < unigram ? "below" : "above");
    std::printf("communication (rank 0): %.2f s (%.0f%% of step time), %s in %llu calls\n", comm_s,
                train_s > 0 ? 100 * comm_s / train_s : 0, mb(double(comm_bytes)).c_str(),
                static_cast<unsigned long long>(comm_calls));
    std::printf("state per rank: params %s + grads %s + optimizer %s = %s; gather buffers %s; peak RSS %.1f MB\n",
                mb(mem.params).c_str(), mb(mem.grads).c_str(), mb(mem.optimizer).c_str(),
                mb(mem.params + mem.grads + mem.optimizer).c_str(), mb(mem.transient).c_str(), ru.ru_maxrss / 1e3);
    if (!last_ckpt.empty()) std::printf("last checkpoint: %s (--resume continues from it)\n", last_ckpt.c_str());
    char title[160];
    std::snprintf(
        title, sizeof(title), "chorus-trainer, %d rank(s): d_model %d, %d layers, %s", N, m.d_model, m.n_layers,
        m.n_experts ? (std::to_string(m.n_experts) + " experts, top-" + std::to_string(m.top_k)).c_str() : "dense");
    write_plot(o.out, h, unigram, o.plot, title);
    std::printf("loss curve: %s/loss.tsv, %s/val.tsv%s\n", o.out.c_str(), o.out.c_str(),
                o.plot && fs::exists(o.out + "/loss.png") ? (", plot " + o.out + "/loss.png").c_str() : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "chorus-trainer: %s\n", e.what());
    return kExitUsage;
  }
  try {
    return run(o);
  } catch (const chorus::CommError& e) {
    std::fprintf(stderr, "chorus-trainer: communication failed: %s\n", e.what());
  } catch (const std::invalid_argument& e) {
    // Flags that parse but describe a run that cannot be (--batch that does not divide over the ranks, --steps -1):
    // a usage error like the ones parse() finds, not a failure of the run.
    std::fprintf(stderr, "chorus-trainer: %s\n", e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "chorus-trainer: error: out of memory: the model or batch is too large for this machine (see %s)\n",
                 kSizeFlags);
  } catch (const std::length_error&) {
    std::fprintf(stderr, "chorus-trainer: error: the model or batch is too large to allocate (see %s)\n", kSizeFlags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chorus-trainer: error: %s\n", e.what());
  }
  return kExitFailed;
}
