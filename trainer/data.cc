#include "trainer/data.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace trainer {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read data file '" + p.string() + "': " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Corpus Corpus::load(const std::string& path, double val_fraction, size_t min_split) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw std::runtime_error("cannot read data '" + path + "': " + (ec ? ec.message() : "no such file or directory"));
  if (!fs::is_directory(st)) return from_text(read_file(path), val_fraction, min_split, path);

  // A directory: each distinct regular file once (Debian's GPL is a symlink to GPL-3, and so on), by name.
  std::vector<fs::path> files;
  std::set<fs::path> seen;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    std::error_code e2;
    if (!fs::is_regular_file(entry.path(), e2)) continue;
    if (seen.insert(fs::canonical(entry.path(), e2)).second) files.push_back(entry.path());
  }
  if (ec) throw std::runtime_error("cannot list data directory '" + path + "': " + ec.message());
  std::sort(files.begin(), files.end());
  std::string text;
  for (const fs::path& f : files) text += read_file(f) + "\n";
  return from_text(text, val_fraction, min_split, path + " (" + std::to_string(files.size()) + " files)");
}

Corpus Corpus::from_text(std::string_view text, double val_fraction, size_t min_split, std::string source) {
  if (text.empty()) throw std::runtime_error("data '" + source + "' is empty");
  if (!(val_fraction > 0 && val_fraction < 1)) throw std::runtime_error("--val-fraction must be between 0 and 1");
  Corpus c;
  c.source = std::move(source);
  // At least 8 blocks of the smaller split: 8 / F blocks (8 / (1 - F) when more is held out than kept).
  const size_t every =
      std::max<size_t>(2, static_cast<size_t>(std::lround(1.0 / std::min(val_fraction, 1 - val_fraction))));
  const size_t block = std::clamp<size_t>(text.size() / (8 * every), 64, 4096);
  for (size_t b = 0, off = 0; off < text.size(); ++b, off += block) {
    const size_t len = std::min(block, text.size() - off);
    // Block b is held out when it brings the held-out count, floor(blocks * F), one up: val_fraction of the blocks,
    // spread evenly (at 0.1 every 10th, at 0.9 nine in ten).
    const bool held_out = std::floor(double(b + 1) * val_fraction) > std::floor(double(b) * val_fraction);
    auto& dst = held_out ? c.val : c.train;
    dst.insert(dst.end(), text.begin() + off, text.begin() + off + len);
  }
  if (c.train.size() < min_split || c.val.size() < min_split)
    throw std::runtime_error("data '" + c.source + "' is too small: " + std::to_string(text.size()) + " bytes give " +
                             std::to_string(c.train.size()) + " training and " + std::to_string(c.val.size()) +
                             " held-out bytes, and each split needs at least " + std::to_string(min_split) +
                             " (one sequence)");
  return c;
}

double unigram_baseline(const Corpus& c) {
  std::vector<double> count(256, 1.0);  // add-one smoothing
  for (uint8_t b : c.train) count[b] += 1;
  const double total = double(c.train.size()) + 256;
  double nll = 0;
  for (uint8_t b : c.val) nll -= std::log(count[b] / total);
  return nll / double(c.val.size());
}

Rng::Rng(uint64_t seed) {
  // Seeded through splitmix64, as the xoshiro authors recommend.
  for (uint64_t& x : s) {
    seed += 0x9e3779b97f4a7c15ull;
    uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    x = z ^ (z >> 31);
  }
}

uint64_t Rng::next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

void Sampler::next(const std::vector<uint8_t>& data, int batch, int T, std::vector<uint8_t>& out) {
  const size_t w = size_t(T) + 1, starts = data.size() - w + 1;
  out.resize(size_t(batch) * w);
  for (int i = 0; i < batch; ++i) {
    const size_t off = rng_.next() % starts;
    std::memcpy(&out[i * w], &data[off], w);
  }
  drawn += batch;
}

std::vector<uint8_t> validation_windows(const std::vector<uint8_t>& val, int T, int count) {
  std::vector<uint8_t> out;
  for (size_t off = 0; int(out.size() / (T + 1)) < count && off + T + 1 <= val.size(); off += T)
    out.insert(out.end(), val.begin() + off, val.begin() + off + T + 1);
  return out;
}

}  // namespace trainer
