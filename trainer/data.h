// Byte-level language-modelling data: a text corpus split into training and held-out bytes, the global batch
// sampler, and the unigram baseline a model has to beat.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

// The licence texts every Debian system ships: real English, about 250 KB.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses";

struct Corpus {
  std::vector<uint8_t> train, val;
  std::string source;  // what was read, for the log

  // `path`: a text file, or a directory whose regular files (symlinks followed, each file once) are concatenated in
  // name order. val_fraction of the text's blocks, spread evenly, go to val (at 0.1 every 10th), the rest to train;
  // a block is 1/80 of the text at 10% (8 held-out blocks over the whole text), between 64 bytes and 4 KiB. Throws
  // std::runtime_error naming the path when it cannot be read, is empty, or leaves a split shorter than min_split
  // bytes.
  static Corpus load(const std::string& path, double val_fraction, size_t min_split);
  static Corpus from_text(std::string_view text, double val_fraction, size_t min_split, std::string source = "text");
};

// Cross-entropy, in nats per byte, of the held-out bytes under the training split's byte frequencies (add-one
// smoothing): what a model that ignores context achieves.
double unigram_baseline(const Corpus& c);

// xoshiro256** (Blackman and Vigna, 2018): small state, saved whole in checkpoints.
struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed = 0);
  uint64_t next();
};

// Draws each step's global batch: `batch` windows of T + 1 bytes at uniformly random offsets of the training split,
// the same on every rank (each rank then takes its slice). Its whole state is the RNG and the windows drawn so far.
class Sampler {
 public:
  explicit Sampler(uint64_t seed) : rng_(seed) {}
  // out: [batch, T + 1].
  void next(const std::vector<uint8_t>& data, int batch, int T, std::vector<uint8_t>& out);
  Rng rng_;
  uint64_t drawn = 0;
};

// The validation set: the first `count` windows of T + 1 bytes of the held-out split at stride T (fewer if the split
// is short), so every run, whatever its number of ranks, evaluates the same bytes. [count, T + 1].
std::vector<uint8_t> validation_windows(const std::vector<uint8_t>& val, int T, int count);

}  // namespace trainer
