#include "common.h"

#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string_view>
#include <thread>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "algorithms/algorithms.h"
#include "algorithms/selector.h"
#include "core/communicator.h"
#include "core/config.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/float_types.h"
#include "kernels/cpu/reduce.h"

namespace chorus::perf {

// ---------------------------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct DtypeName {
  chorusDataType_t dtype;
  const char* name;                  // as printed
  std::vector<std::string> aliases;  // also accepted by -d
};

const std::vector<DtypeName>& dtype_table() {
  static const std::vector<DtypeName> table = {
      {chorusInt8, "int8", {"char"}},
      {chorusUint8, "uint8", {}},
      {chorusInt32, "int32", {"int"}},
      {chorusUint32, "uint32", {}},
      {chorusInt64, "int64", {}},
      {chorusUint64, "uint64", {}},
      {chorusFloat16, "half", {"float16", "fp16"}},
      {chorusFloat32, "float", {"float32", "fp32"}},
      {chorusFloat64, "double", {"float64", "fp64"}},
      {chorusBfloat16, "bfloat16", {"bf16"}},
      {chorusFloat8e4m3, "f8e4m3", {"fp8_e4m3", "e4m3"}},
      {chorusFloat8e5m2, "f8e5m2", {"fp8_e5m2", "e5m2"}},
  };
  return table;
}

const std::vector<std::pair<Op, const char*>>& op_table() {
  static const std::vector<std::pair<Op, const char*>> table = {
      {Op::Sum, "sum"}, {Op::Prod, "prod"}, {Op::Max, "max"},
      {Op::Min, "min"}, {Op::Avg, "avg"},   {Op::PreMulSum, "premulsum"},
  };
  return table;
}

std::vector<chorusDataType_t> all_dtypes() {
  std::vector<chorusDataType_t> v;
  for (const auto& d : dtype_table()) v.push_back(d.dtype);
  return v;
}

std::vector<Op> all_ops() {
  std::vector<Op> v;
  for (const auto& [op, name] : op_table()) v.push_back(op);
  return v;
}

}  // namespace

const char* op_name(Op op) {
  if (op == Op::None) return "none";
  for (const auto& [o, name] : op_table())
    if (o == op) return name;
  return "?";
}

const char* dtype_name(chorusDataType_t dtype) {
  for (const auto& d : dtype_table())
    if (d.dtype == dtype) return d.name;
  return "?";
}

void check_chorus(chorusResult_t result, const char* call, chorusComm_t comm, int rank) {
  if (result == chorusSuccess) return;
  std::string text = "rank " + std::to_string(rank) + ": " + call + " failed: " + chorusGetErrorString(result);
  const char* detail = chorusGetLastError(comm);
  if (detail != nullptr && *detail != '\0') text += std::string(" (") + detail + ")";
  throw PerfError(text, result == chorusInvalidArgument || result == chorusNotSupported);
}

// ---------------------------------------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------------------------------------

const char* const kAllFlags = "beifnwcdorzatgJmpGCNTAZh";

ToolInfo chorus_tool(const std::string& name) { return ToolInfo{name, kAllFlags, all_dtypes(), all_ops()}; }

namespace {

struct FlagSpec {
  char short_name;
  const char* long_name;
  bool has_arg;
  const char* help;
};

const FlagSpec kFlags[] = {
    {'b', "minbytes", true, "smallest size in bytes (K/M/G suffixes; default 32M)"},
    {'e', "maxbytes", true, "largest size in bytes (default 32M)"},
    {'i', "stepbytes", true, "size increment when no -f factor is given (default 1M)"},
    {'f', "stepfactor", true, "size multiplier; sizes grow geometrically when > 1"},
    {'n', "iters", true, "timed iterations per size (default 20)"},
    {'w', "warmup_iters", true, "untimed iterations before timing (default 5)"},
    {'c', "check", true, "checked iterations per size; 0 disables checking (default 1)"},
    {'d', "datatype", true, "dtype name, a comma-separated list, or all (default float)"},
    {'o', "op", true, "sum, prod, max, min, avg, premulsum, a comma-separated list, or all (default sum)"},
    {'r', "root", true, "root rank of rooted collectives; -1 or all: every root in turn (default 0)"},
    {'z', "blocking", true, "0/1; accepted for compatibility: host calls always block"},
    {'a', "average", true, "time reported over ranks: 0 rank 0, 1 average, 2 minimum, 3 maximum (default 1)"},
    {'t', "nthreads", true, "ranks as threads of this process when no launcher set the rank (default 1)"},
    {'g', "ngpus", true, "devices per thread; must be 1"},
    {'J', "output_file", true, "write the results as a JSON array to this file"},
    {'m', "agg_iters", true, "operations aggregated per iteration; must be 1"},
    {'p', "parallel_init", true, "0/1; accepted for compatibility"},
    {'G', "cudagraph", true, "CUDA graph launches; must be 0 for host buffers"},
    {'C', "report_cputime", true, "0/1; the same as wall time here since host calls block"},
    {'N', "run_cycles", true, "repeat the whole sweep this many times (default 1)"},
    {'T', "timeout", true, "seconds before a stuck operation fails (sets CHORUS_TIMEOUT_MS; 0: library default)"},
    {'A', "algorithm", true, "algorithm for every call, by name as chorus-info lists them (default: the selector)"},
    {'Z', "compression", true,
     "codec for every call (all_reduce, reduce_scatter, all_gather; float, half or bfloat16): int8[:block], fp8_e4m3, "
     "int4, "
     "sign1[:block], sign_vote (all_reduce only), with ':rht' at the end for the randomized Hadamard rotation (int8, "
     "fp8_e4m3, int4, and "
     "sign1 with a power-of-two block up to 4096). Every call is step 0 (no error feedback: each call is measured "
     "alone; -o sum or avg, sign_vote sum). busbw is then effective (uncompressed bytes over time) and #wrong shows "
     "the relative L2 error against an fp64 reference (sign_vote: the share of elements off the majority sign), "
     "reported, not judged; or, when an all-reduce or all-gather leaves ranks with different bits, their number "
     "(a failure)"},
    {'h', "help", false, "print this help"},
};

void print_usage(FILE* f, const ToolInfo& tool) {
  std::fprintf(f, "usage: %s [flags]\n", tool.name.c_str());
  for (const FlagSpec& s : kFlags) {
    if (tool.flags.find(s.short_name) == std::string::npos) continue;
    std::string left = std::string("-") + s.short_name + ", --" + s.long_name + (s.has_arg ? " <v>" : "");
    std::fprintf(f, "  %-28s %s\n", left.c_str(), s.help);
  }
  std::fprintf(f, "  dtypes:");
  for (chorusDataType_t d : tool.dtypes) std::fprintf(f, " %s", dtype_name(d));
  std::fprintf(f, "\n  ops:");
  for (Op o : tool.ops) std::fprintf(f, " %s", op_name(o));
  std::fprintf(f, "\nExit status: 0 all results correct, 1 wrong results or a failed call, 2 bad flags.\n");
}

// Thrown by the value parsers; the caller names the flag.
struct BadValue {
  std::string why;
};

size_t parse_size(const char* text) {
  const std::string_view s(text);
  size_t pos = 0;
  uint64_t v = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    if (v > (std::numeric_limits<uint64_t>::max() - 9) / 10) throw BadValue{"too large"};
    v = v * 10 + static_cast<uint64_t>(s[pos] - '0');
    ++pos;
  }
  if (pos == 0) throw BadValue{"expected a size such as 8, 64K, 32M or 1G"};
  uint64_t mult = 1;
  if (pos < s.size()) {
    switch (s[pos]) {
      case 'k':
      case 'K': mult = uint64_t{1} << 10; break;
      case 'm':
      case 'M': mult = uint64_t{1} << 20; break;
      case 'g':
      case 'G': mult = uint64_t{1} << 30; break;
      default: throw BadValue{"expected a size such as 8, 64K, 32M or 1G"};
    }
    ++pos;
    if (pos < s.size() && (s[pos] == 'B' || s[pos] == 'b')) ++pos;
    if (pos != s.size()) throw BadValue{"expected a size such as 8, 64K, 32M or 1G"};
  }
  if (v > std::numeric_limits<uint64_t>::max() / mult) throw BadValue{"too large"};
  return static_cast<size_t>(v * mult);
}

int parse_int(const char* text, int lo, int hi) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0) throw BadValue{"expected an integer"};
  if (lo == hi && v != lo) throw BadValue{"must be " + std::to_string(lo)};
  if (v < lo || v > hi) throw BadValue{"must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"};
  return static_cast<int>(v);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::vector<chorusDataType_t> parse_dtypes(const std::string& text, const ToolInfo& tool) {
  if (text == "all") return tool.dtypes;
  std::vector<chorusDataType_t> out;
  for (const std::string& word : split_commas(text)) {
    const DtypeName* found = nullptr;
    for (const auto& d : dtype_table())
      if (word == d.name || std::find(d.aliases.begin(), d.aliases.end(), word) != d.aliases.end()) found = &d;
    if (found == nullptr) throw BadValue{"unknown datatype '" + word + "'"};
    if (std::find(tool.dtypes.begin(), tool.dtypes.end(), found->dtype) == tool.dtypes.end())
      throw BadValue{"datatype '" + word + "' is not supported by this tool"};
    out.push_back(found->dtype);
  }
  return out;
}

std::vector<Op> parse_ops(const std::string& text, const ToolInfo& tool) {
  if (text == "all") return tool.ops;
  std::vector<Op> out;
  for (const std::string& word : split_commas(text)) {
    Op found = Op::None;
    for (const auto& [op, name] : op_table())
      if (word == name) found = op;
    if (found == Op::None) throw BadValue{"unknown op '" + word + "'"};
    if (std::find(tool.ops.begin(), tool.ops.end(), found) == tool.ops.end())
      throw BadValue{"op '" + word + "' is not supported by this tool"};
    out.push_back(found);
  }
  return out;
}

}  // namespace

int parse_options(int argc, char** argv, const ToolInfo& tool, Options* out, bool verbose) {
  Options o;
  std::string optstring = ":";  // leading ':' makes a missing value distinguishable from an unknown flag
  std::vector<option> longopts;
  for (const FlagSpec& s : kFlags) {
    if (tool.flags.find(s.short_name) == std::string::npos) continue;
    optstring += s.short_name;
    if (s.has_arg) optstring += ':';
    longopts.push_back({s.long_name, s.has_arg ? required_argument : no_argument, nullptr, s.short_name});
  }
  longopts.push_back({nullptr, 0, nullptr, 0});

  auto flag_text = [](char c) -> std::string {
    for (const FlagSpec& s : kFlags)
      if (s.short_name == c) return std::string("-") + c + "/--" + s.long_name;
    return std::string("-") + c;
  };
  auto fail = [&](const std::string& msg) {
    if (verbose) std::fprintf(stderr, "%s: %s (see -h)\n", tool.name.c_str(), msg.c_str());
    return kExitUsage;
  };

  bool factor_given = false;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, optstring.c_str(), longopts.data(), nullptr)) != -1) {
    if (c == '?') {
      const std::string what = optopt != 0 ? std::string("-") + static_cast<char>(optopt) : argv[optind - 1];
      return fail("unknown or unsupported flag '" + what + "'");
    }
    if (c == ':') {
      const std::string what = optopt != 0 ? flag_text(static_cast<char>(optopt)) : argv[optind - 1];
      return fail("flag " + what + " needs a value");
    }
    try {
      switch (c) {
        case 'b': o.min_bytes = parse_size(optarg); break;
        case 'e': o.max_bytes = parse_size(optarg); break;
        case 'i': o.step_bytes = parse_size(optarg); break;
        case 'f':
          o.step_factor = parse_int(optarg, 1, 1 << 20);
          factor_given = true;
          break;
        case 'n': o.iters = parse_int(optarg, 1, 1 << 30); break;
        case 'w': o.warmup_iters = parse_int(optarg, 0, 1 << 30); break;
        case 'c': o.check_iters = parse_int(optarg, 0, 1 << 20); break;
        case 'd': o.dtypes = parse_dtypes(optarg, tool); break;
        case 'o': o.ops = parse_ops(optarg, tool); break;
        case 'r':
          if (std::string_view(optarg) == "all") {
            o.root = -1;
          } else {
            try {
              o.root = parse_int(optarg, -1, (1 << 30) - 1);
            } catch (const BadValue&) {
              throw BadValue{"must be a rank in [0, 2^30), or -1 or 'all' (every root in turn)"};
            }
          }
          break;
        case 'z': o.blocking = parse_int(optarg, 0, 1) != 0; break;
        case 'a': o.average = static_cast<Average>(parse_int(optarg, 0, 3)); break;
        case 't': o.nthreads = parse_int(optarg, 1, 1024); break;
        case 'g': o.ngpus = parse_int(optarg, 1, 1); break;
        case 'J':
          if (*optarg == '\0') throw BadValue{"expected a file name"};
          o.json_path = optarg;
          break;
        case 'm': parse_int(optarg, 1, 1); break;
        case 'p': parse_int(optarg, 0, 1); break;
        case 'G': parse_int(optarg, 0, 0); break;
        case 'C': o.report_cputime = parse_int(optarg, 0, 1) != 0; break;
        case 'N': o.cycles = parse_int(optarg, 1, 1 << 20); break;
        case 'T': o.timeout_s = parse_int(optarg, 0, 1 << 20); break;
        case 'A':
          if (*optarg == '\0') throw BadValue{"expected an algorithm name"};
          o.algorithm = optarg;
          break;
        case 'Z': {
          std::string v = optarg;
          o.compression_rotation = v.size() > 4 && v.compare(v.size() - 4, 4, ":rht") == 0;
          if (o.compression_rotation) v.resize(v.size() - 4);
          const std::string name = v.substr(0, v.find(':'));
          static const char* const kNames[] = {"int8", "fp8_e4m3", "int4", "sign1", "sign_vote"};
          o.compression = 0;
          for (int k = 0; k < 5; ++k)
            if (name == kNames[k]) o.compression = k + 1;
          if (o.compression == 0)
            throw BadValue{"expected int8[:block], fp8_e4m3, int4, sign1[:block] or sign_vote, then :rht or nothing"};
          if (v.find(':') != std::string::npos)
            o.compression_block = static_cast<uint32_t>(parse_int(v.substr(v.find(':') + 1).c_str(), 0, 1 << 30));
          // The block and rotation as the library checks them (0: the codec's default), before anything runs.
          kernels::codec::Codec codec;  // o.compression is the chorusCodec_t value (kNames is in its order)
          codec.kind = kernels::codec::codec_kind(static_cast<chorusCodec_t>(o.compression));
          codec.block = o.compression_block;
          codec.rotation = o.compression_rotation;
          try {
            kernels::codec::validate(codec);
          } catch (const Error& e) {
            throw BadValue{e.what()};
          }
          break;
        }
        case 'h': print_usage(stdout, tool); return kExitOk;
        default: return fail("unknown flag");
      }
    } catch (const BadValue& e) {
      return fail("invalid value '" + std::string(optarg ? optarg : "") + "' for " + flag_text(static_cast<char>(c)) +
                  ": " + e.why);
    }
  }
  if (optind < argc) return fail(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.min_bytes > o.max_bytes) return fail("-b/--minbytes is larger than -e/--maxbytes");
  if (factor_given && o.step_factor <= 1) o.step_factor = 0;
  if (o.step_factor == 0 && o.step_bytes == 0 && o.min_bytes < o.max_bytes)
    return fail("-i/--stepbytes must be > 0 when sizes grow by addition");
  *out = std::move(o);
  return -1;
}

std::vector<size_t> sweep_sizes(const Options& opts) {
  std::vector<size_t> sizes;
  size_t s = opts.min_bytes;
  while (true) {
    sizes.push_back(s);
    size_t next;
    if (opts.step_factor > 1) {
      if (s == 0) {
        next = 1;  // a geometric sweep from 0 would never move
      } else {
        if (s > opts.max_bytes / static_cast<size_t>(opts.step_factor)) break;
        next = s * static_cast<size_t>(opts.step_factor);
      }
    } else {
      if (opts.step_bytes == 0 || s > opts.max_bytes - opts.step_bytes) break;
      next = s + opts.step_bytes;
    }
    if (next > opts.max_bytes) break;
    s = next;
  }
  return sizes;
}

// ---------------------------------------------------------------------------------------------------------------
// Data: every input element is a small integer chosen so that every partial result of the reduction is exact in
// the dtype, whatever order or grouping the library picks. Then the expected output is known exactly on every
// rank, and only avg on floating types (a division) needs a tolerance.
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};
struct E4M3 {
  uint8_t bits;
};
struct E5M2 {
  uint8_t bits;
};

// kExactInt: every integer of magnitude <= it is exact; kMaxPow2: largest finite power of two exponent.
template <class T>
struct FloatTraits;
template <>
struct FloatTraits<float> {
  static double get(float v) { return v; }
  static float make(double d) { return static_cast<float>(d); }
  static constexpr double kEps = 0x1p-23;
  static constexpr double kTiny = 0x1p-149;  // the smallest positive value (subnormal)
  static constexpr int64_t kExactInt = int64_t{1} << 24;
  static constexpr int kMaxPow2 = 127;
};
template <>
struct FloatTraits<double> {
  static double get(double v) { return v; }
  static double make(double d) { return d; }
  static constexpr double kEps = 0x1p-52;
  static constexpr double kTiny = 0x1p-1074;  // the smallest positive value (subnormal)
  static constexpr int64_t kExactInt = int64_t{1} << 53;
  static constexpr int kMaxPow2 = 1023;
};
template <>
struct FloatTraits<Half> {
  static double get(Half v) { return kernels::half_to_float(v.bits); }
  static Half make(double d) { return {kernels::float_to_half(static_cast<float>(d))}; }
  static constexpr double kEps = 0x1p-10;
  static constexpr double kTiny = 0x1p-24;  // the smallest positive value (subnormal)
  static constexpr int64_t kExactInt = 2048;
  static constexpr int kMaxPow2 = 15;
};
template <>
struct FloatTraits<Bf16> {
  static double get(Bf16 v) { return kernels::bf16_to_float(v.bits); }
  static Bf16 make(double d) { return {kernels::float_to_bf16(static_cast<float>(d))}; }
  static constexpr double kEps = 0x1p-7;
  static constexpr double kTiny = 0x1p-133;  // the smallest positive value (subnormal)
  static constexpr int64_t kExactInt = 256;
  static constexpr int kMaxPow2 = 127;
};
template <>
struct FloatTraits<E4M3> {
  static double get(E4M3 v) { return kernels::e4m3_to_float(v.bits); }
  static E4M3 make(double d) { return {kernels::float_to_e4m3(static_cast<float>(d))}; }
  static constexpr double kEps = 0x1p-3;
  static constexpr double kTiny = 0x1p-9;  // the smallest positive value (subnormal)
  static constexpr int64_t kExactInt = 16;
  static constexpr int kMaxPow2 = 8;  // 448 is the largest finite value
};
template <>
struct FloatTraits<E5M2> {
  static double get(E5M2 v) { return kernels::e5m2_to_float(v.bits); }
  static E5M2 make(double d) { return {kernels::float_to_e5m2(static_cast<float>(d))}; }
  static constexpr double kEps = 0x1p-2;
  static constexpr double kTiny = 0x1p-16;  // the smallest positive value (subnormal)
  static constexpr int64_t kExactInt = 8;
  static constexpr int kMaxPow2 = 15;
};

template <class T>
constexpr bool kIsInt = std::is_integral_v<T>;

template <class T>
struct Tag {
  using type = T;
};

template <class F>
decltype(auto) with_type(chorusDataType_t dtype, F&& f) {
  switch (dtype) {
    case chorusInt8: return f(Tag<int8_t>{});
    case chorusUint8: return f(Tag<uint8_t>{});
    case chorusInt32: return f(Tag<int32_t>{});
    case chorusUint32: return f(Tag<uint32_t>{});
    case chorusInt64: return f(Tag<int64_t>{});
    case chorusUint64: return f(Tag<uint64_t>{});
    case chorusFloat16: return f(Tag<Half>{});
    case chorusFloat32: return f(Tag<float>{});
    case chorusFloat64: return f(Tag<double>{});
    case chorusBfloat16: return f(Tag<Bf16>{});
    case chorusFloat8e4m3: return f(Tag<E4M3>{});
    case chorusFloat8e5m2: return f(Tag<E5M2>{});
    default: break;
  }
  throw PerfError("unsupported datatype " + std::to_string(static_cast<int>(dtype)));
}

// Integers wrap modulo 2^bits (C++20 conversions are modular), which is also what the library does.
template <class T>
T from_int(int64_t v) {
  if constexpr (kIsInt<T>)
    return static_cast<T>(v);
  else
    return FloatTraits<T>::make(static_cast<double>(v));
}

// splitmix64's output function (Steele, Lea, Flood 2014): a well-mixed 64-bit hash of z, for the data the tools fill
// buffers with.
uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

enum class Family { Copy, Sum, Prod, MinMax };

Family family_of(Op op) {
  switch (op) {
    case Op::None: return Family::Copy;
    case Op::Sum:
    case Op::Avg:
    case Op::PreMulSum: return Family::Sum;
    case Op::Prod: return Family::Prod;
    case Op::Max:
    case Op::Min: return Family::MinMax;
  }
  return Family::Copy;
}

struct DataModel {
  Family family = Family::Copy;
  // Sum: only ranks with r % q == i % q hold a non-zero at element i; Prod: they hold the 2s. q bounds the
  // magnitude of any partial result so that it stays exact in narrow floating types.
  uint64_t q = 1;

  // A hash of (rank, element), so that no two ranks hold the same data (a pattern periodic in the rank let a
  // block from the wrong rank, or a copy that never happened, pass the check).
  static uint64_t mix(uint64_t r, uint64_t x) { return splitmix64(r << 40 ^ x); }

  int64_t value(int rank, size_t i) const {
    const uint64_t r = static_cast<uint64_t>(rank);
    const uint64_t x = i;
    switch (family) {
      case Family::Copy: return static_cast<int64_t>(mix(r, x) % 17) - 8;  // [-8, 8]
      case Family::Sum:
        if (r % q != x % q) return 0;
        return static_cast<int64_t>(mix(r, x) % 3) - 1;  // {-1, 0, 1}
      case Family::Prod:
        if (r % q == x % q) return 2;
        return mix(r, x) % 4 == 1 ? -1 : 1;
      case Family::MinMax: return static_cast<int64_t>(mix(r, x) % 11) - 5;  // [-5, 5]
    }
    return 0;
  }
};

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

DataModel make_model(Op op, chorusDataType_t dtype, int nranks) {
  DataModel m;
  m.family = family_of(op);
  const uint64_t n = static_cast<uint64_t>(std::max(nranks, 1));
  with_type(dtype, [&]<class T>(Tag<T>) {
    if (m.family == Family::Sum) {
      if constexpr (!kIsInt<T>) {
        // Up to `cap` non-zeros of magnitude 1, scaled by at most kPreMulScalar, must stay exactly representable.
        const uint64_t cap = static_cast<uint64_t>(FloatTraits<T>::kExactInt / kPreMulScalar);
        m.q = std::max<uint64_t>(1, ceil_div(n, cap));
      }
    } else if (m.family == Family::Prod) {
      m.q = 2;
      if constexpr (!kIsInt<T>) m.q = std::max<uint64_t>(2, ceil_div(n, FloatTraits<T>::kMaxPow2));
    }
  });
  return m;
}

template <class T>
void fill_typed(const DataModel& m, int rank, T* in, size_t count) {
  for (size_t i = 0; i < count; ++i) in[i] = from_int<T>(m.value(rank, i));
}

template <class T>
bool same(T got, T want) {
  if constexpr (kIsInt<T>)
    return got == want;
  else
    return FloatTraits<T>::get(got) == FloatTraits<T>::get(want);  // +0 == -0; NaN never matches
}

// The exact result of reducing element `index` over all ranks, in T's own arithmetic.
template <class T>
bool reduced_ok(T got, const DataModel& m, Op op, int nranks, size_t index) {
  if constexpr (kIsInt<T>) {
    T want{};
    switch (op) {
      case Op::Sum:
      case Op::Avg:
      case Op::PreMulSum: {
        const uint64_t scale = op == Op::PreMulSum ? static_cast<uint64_t>(kPreMulScalar) : 1;
        uint64_t acc = 0;
        for (int r = 0; r < nranks; ++r) acc += scale * static_cast<uint64_t>(static_cast<T>(m.value(r, index)));
        want = static_cast<T>(acc);
        if (op == Op::Avg) {
          // The sum wraps in T, then divides truncating toward zero.
          if constexpr (std::is_signed_v<T>)
            want = static_cast<T>(static_cast<int64_t>(want) / nranks);
          else
            want = static_cast<T>(static_cast<uint64_t>(want) / static_cast<uint64_t>(nranks));
        }
        break;
      }
      case Op::Prod: {
        uint64_t acc = 1;
        for (int r = 0; r < nranks; ++r) acc *= static_cast<uint64_t>(static_cast<T>(m.value(r, index)));
        want = static_cast<T>(acc);
        break;
      }
      case Op::Max:
      case Op::Min: {
        want = static_cast<T>(m.value(0, index));
        for (int r = 1; r < nranks; ++r) {
          const T v = static_cast<T>(m.value(r, index));
          want = op == Op::Max ? std::max(want, v) : std::min(want, v);
        }
        break;
      }
      case Op::None: return false;
    }
    return got == want;
  } else {
    using FT = FloatTraits<T>;
    double want = 0;
    switch (op) {
      case Op::Sum:
      case Op::Avg:
      case Op::PreMulSum: {
        const double scale = op == Op::PreMulSum ? static_cast<double>(kPreMulScalar) : 1.0;
        for (int r = 0; r < nranks; ++r) want += scale * static_cast<double>(m.value(r, index));
        if (op == Op::Avg) {
          // The partial sums are exact (the data model keeps them small), and the library divides once, where the
          // sum is complete, in fp32: one rounding to fp32, one to T. Allowed: one ulp of T at the exact average (twice
          // the half ulp of a rounding), or T's smallest step near zero. (An absolute bound in nranks let an output of
          // zeros pass the fp8 averages from 7 ranks.)
          const double exact = want / nranks;
          const double g = FT::get(got);
          return std::fabs(g - exact) <= FT::kEps * std::fabs(exact) + FT::kTiny;
        }
        break;
      }
      case Op::Prod:
        want = 1;
        for (int r = 0; r < nranks; ++r) want *= static_cast<double>(m.value(r, index));
        break;
      case Op::Max:
      case Op::Min:
        want = static_cast<double>(m.value(0, index));
        for (int r = 1; r < nranks; ++r) {
          const double v = static_cast<double>(m.value(r, index));
          want = op == Op::Max ? std::max(want, v) : std::min(want, v);
        }
        break;
      case Op::None: return false;
    }
    return same(got, FT::make(want));
  }
}

template <class T>
size_t check_typed(const Collective& coll, const Layout& l, const DataModel& m, Op op, int rank, int nranks, int root,
                   const T* out) {
  size_t wrong = 0;
  for (size_t i = 0; i < l.recv_count; ++i) {
    const Expect e = coll.expect(l, rank, nranks, root, i);
    switch (e.kind) {
      case Expect::Skip: break;
      case Expect::Copy:
        if (!same(out[i], from_int<T>(m.value(e.rank, e.index)))) ++wrong;
        break;
      case Expect::Reduce:
        if (!reduced_ok(out[i], m, op, nranks, e.index)) ++wrong;
        break;
    }
  }
  return wrong;
}

// Written over the output before a checked run, so that an operation which leaves the output alone cannot pass:
// NaN for floating types, and for integers a value no sum, product or min/max of the data can produce.
void poison(chorusDataType_t dtype, void* out, size_t bytes) {
  const bool is_float = with_type(dtype, []<class T>(Tag<T>) { return !kIsInt<T>; });
  std::memset(out, is_float ? 0xff : 0xa5, bytes);
}

// ---------------------------------------------------------------------------------------------------------------
// Buffers: allocated once at the largest size and touched before any timing (first touch costs far more than the
// copy on these machines).
// ---------------------------------------------------------------------------------------------------------------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte, FreeDeleter>;

Buffer make_buffer(size_t bytes) {
  constexpr size_t kAlign = 4096;
  const size_t rounded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) throw PerfError("cannot allocate " + std::to_string(rounded) + " bytes");
  std::memset(p, 0, rounded);
  return Buffer(static_cast<std::byte*>(p));
}

// ---------------------------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------------------------

struct Measured {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = -1;     // -1: not checked
  double rel_error = -1;  // compressed calls: relative L2 error against the fp64 reference; -1: not measured
  std::string algorithm;  // what the timed calls ran (Backend::last_algorithm); empty for the baselines
};

struct Row {
  size_t bytes = 0;
  size_t elements = 0;
  chorusDataType_t dtype = chorusFloat32;
  Op op = Op::None;
  int root = -1;
  Measured place[2];  // out of place, in place
};

std::string format_time(double us) {
  char buf[32];
  if (us < 1e4)
    std::snprintf(buf, sizeof buf, "%.2f", us);
  else if (us < 1e5)
    std::snprintf(buf, sizeof buf, "%.1f", us);
  else
    std::snprintf(buf, sizeof buf, "%.0f", us);
  return buf;
}

constexpr const char* kRowLead = "%12s  %12s  %8s  %9s  %6s";
constexpr const char* kPlaceCols = "  %9s  %8s  %8s  %6s";

void print_table_header() {
  std::printf("#\n");
  char lead[128];
  std::snprintf(lead, sizeof lead, kRowLead, "", "", "", "", "");
  // Each label centred over its group of four columns.
  const int width = std::snprintf(nullptr, 0, kPlaceCols, "", "", "", "");
  std::printf("#%s", lead + 1);
  for (const char* label : {"out-of-place", "in-place"}) {
    const int len = static_cast<int>(std::strlen(label)), left = (width - len + 1) / 2;
    std::printf("%*s%s%*s", left, "", label, width - len - left, "");
  }
  std::printf("\n");
  std::printf("#");
  std::snprintf(lead, sizeof lead, kRowLead, "size", "count", "type", "redop", "root");
  std::printf("%s", lead + 1);
  for (int p = 0; p < 2; ++p) std::printf(kPlaceCols, "time", "algbw", "busbw", "#wrong");
  std::printf("\n#");
  std::snprintf(lead, sizeof lead, kRowLead, "(B)", "(elements)", "", "", "");
  std::printf("%s", lead + 1);
  for (int p = 0; p < 2; ++p) std::printf(kPlaceCols, "(us)", "(GB/s)", "(GB/s)", "");
  std::printf("\n");
  std::fflush(stdout);
}

void print_row(const Row& row) {
  const std::string bytes = std::to_string(row.bytes), elements = std::to_string(row.elements),
                    root = std::to_string(row.root);
  std::printf(kRowLead, bytes.c_str(), elements.c_str(), dtype_name(row.dtype), op_name(row.op), root.c_str());
  for (const Measured& m : row.place) {
    char algbw[32], busbw[32];
    std::snprintf(algbw, sizeof algbw, "%.2f", m.algbw);
    std::snprintf(busbw, sizeof busbw, "%.2f", m.busbw);
    std::string wrong = m.wrong < 0 ? "N/A" : std::to_string(m.wrong);
    if (m.rel_error >= 0 && m.wrong <= 0) {
      char e[32];
      std::snprintf(e, sizeof e, "%.1e", m.rel_error);
      wrong = e;
    }
    std::printf(kPlaceCols, format_time(m.time_us).c_str(), algbw, busbw, wrong.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

// One rank's description, exchanged as fixed-size bytes so that any backend can gather it.
struct RankInfo {
  int32_t rank = 0;
  int32_t pid = 0;
  int32_t can_write_json = 1;  // the leader's verdict on -J's file; 1 on the other ranks
  char host[116] = {};
};
static_assert(sizeof(RankInfo) == 128);

const char* average_name(Average a) {
  switch (a) {
    case Average::Rank0: return "rank 0";
    case Average::Avg: return "average";
    case Average::Min: return "minimum";
    case Average::Max: return "maximum";
  }
  return "?";
}

double reduce_time(Backend& b, double local_us, Average how) {
  double v = local_us;
  switch (how) {
    case Average::Rank0:
      v = b.rank() == 0 ? local_us : 0.0;
      b.allreduce(&v, 1, Op::Sum);
      return v;
    case Average::Avg: b.allreduce(&v, 1, Op::Sum); return v / b.nranks();
    case Average::Min: b.allreduce(&v, 1, Op::Min); return v;
    case Average::Max: b.allreduce(&v, 1, Op::Max); return v;
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// The sweep
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct SweepState {
  const Options& opts;
  const Collective& coll;
  Backend& b;
  std::byte* send = nullptr;
  std::byte* recv = nullptr;
  chorusCollOptions_t options = CHORUS_COLL_OPTIONS_INIT;                      // the algorithm (-A) of every call
  chorusCompression_t compression = CHORUS_COMPRESSION_INIT(chorusCodecInt8);  // -Z
};

// Compressed runs: pseudo-normal inputs (splitmix64 and Box-Muller on (rank, element)), exact in float.
float normal_value(int rank, size_t i) {
  const uint64_t h = splitmix64((static_cast<uint64_t>(rank) << 40) ^ i);
  const double u1 = (static_cast<double>(h >> 11) + 1.0) / 9007199254740993.0, u2 = (splitmix64(h) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// -Z input: element i of rank r is a standard normal value (the codecs' error is measured on such data), rounded to
// the call's float type (float32, float16 or bfloat16).
float compressed_input_value(chorusDataType_t dtype, int r, size_t i) {
  const float v = normal_value(r, i);
  if (dtype == chorusFloat32) return v;
  uint16_t narrow = 0;
  kernels::narrow_from_float(dtype, &v, &narrow, 1);
  float wide = 0;
  kernels::widen_to_float(dtype, &narrow, &wide, 1);
  return wide;
}

void fill_compressed_input(const OpArgs& a, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = normal_value(a.rank, i);
  kernels::narrow_from_float(a.dtype, v.data(), const_cast<void*>(a.send), count);
}

// This rank's error against the fp64 reference of the call, as a (numerator, denominator) pair summed over ranks:
// squared error and squared reference (the relative L2 error is the square root of their ratio); for sign_vote,
// whose result is the majority sign of the inputs, elements whose sign is not that majority's and elements with a
// majority (ties are left out).
// The reference is the exact result of the inputs as the call's float type holds them.
std::pair<double, double> compressed_error(const Collective& coll, const Layout& l, int rank, int nranks, int root,
                                           Op op, bool sign_vote, chorusDataType_t dtype, const void* recv) {
  std::vector<float> out(l.recv_count);
  kernels::widen_to_float(dtype, recv, out.data(), l.recv_count);
  auto input = [dtype](int r, size_t i) { return compressed_input_value(dtype, r, i); };
  double num = 0, den = 0;
  for (size_t i = 0; i < l.recv_count; ++i) {
    const Expect e = coll.expect(l, rank, nranks, root, i);
    if (e.kind == Expect::Skip) continue;
    double want = 0;
    if (e.kind == Expect::Copy) {
      want = input(e.rank, e.index);
    } else if (sign_vote) {
      int votes = 0;
      for (int r = 0; r < nranks; ++r) votes += input(r, e.index) < 0 ? -1 : 1;
      if (votes == 0) continue;
      num += (votes < 0) != (out[i] < 0) ? 1 : 0;
      den += 1;
      continue;
    } else {
      for (int r = 0; r < nranks; ++r) want += input(r, e.index);
      if (op == Op::Avg) want /= nranks;
    }
    num += (out[i] - want) * (out[i] - want);
    den += want * want;
  }
  return {num, den};
}

// The pointers of one operation: separate buffers, or one buffer holding both when in place.
OpArgs make_args(const SweepState& s, const Layout& l, size_t ts, bool inplace) {
  OpArgs a;
  a.inplace = inplace;
  a.count = l.count;
  a.rank = s.b.rank();
  a.nranks = s.b.nranks();
  a.comm = s.b.comm();
  a.options = &s.options;
  if (!inplace) {
    a.send = s.send;
    a.recv = s.recv;
  } else {
    std::byte* base = l.recv_count >= l.send_count ? s.recv : s.send;
    a.send = base + s.coll.inplace_send_offset(l, a.rank) * ts;
    a.recv = base + s.coll.inplace_recv_offset(l, a.rank) * ts;
  }
  return a;
}

void fill_input(const DataModel& m, const OpArgs& a, size_t count) {
  with_type(a.dtype,
            [&]<class T>(Tag<T>) { fill_typed(m, a.rank, static_cast<T*>(const_cast<void*>(a.send)), count); });
}

Measured measure(SweepState& s, const Layout& l, size_t ts, OpArgs a, const DataModel& m) {
  Backend& b = s.b;
  const Options& o = s.opts;
  if (o.compression != 0) {
    fill_compressed_input(a, l.send_count);
  } else {
    fill_input(m, a, l.send_count);
  }
  for (int i = 0; i < o.warmup_iters; ++i) s.coll.run(a);
  b.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) s.coll.run(a);
  const auto t1 = std::chrono::steady_clock::now();
  const double local_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / o.iters;

  Measured r;
  r.algorithm = b.last_algorithm();  // the timed calls' (after the barrier before them, before the timing's all-reduce)
  r.time_us = reduce_time(b, local_us, o.average);
  r.algbw = r.time_us > 0 ? static_cast<double>(l.bytes) / (r.time_us * 1e3) : 0.0;  // bytes/us/1e3 = GB/s
  r.busbw = r.algbw * s.coll.bus_factor(b.nranks());

  if (o.check_iters > 0 && o.compression != 0) {
    poison(a.dtype, a.recv, l.recv_count * ts);
    fill_compressed_input(a, l.send_count);
    s.coll.run(a);
    const bool sign_vote = o.compression == chorusCodecSignVote;
    auto [num, den] = compressed_error(s.coll, l, a.rank, a.nranks, a.root, a.op, sign_vote, a.dtype, a.recv);
    double sums[2] = {num, den};
    b.allreduce(sums, 2, Op::Sum);
    r.rel_error = sums[1] > 0 ? (sign_vote ? sums[0] / sums[1] : std::sqrt(sums[0] / sums[1])) : 0.0;
    // The error is reported, not judged (docs/compression.md bounds it per codec; the unit tests check the bounds).
    // What is checked: every rank of an all-reduce or all-gather ends with the same bits. #wrong counts the ranks
    // whose result differs from rank 0's.
    r.wrong = 0;
    const std::string name = s.coll.name();
    if (name == "all_reduce" || name == "all_gather") {
      uint64_t h = 0xcbf29ce484222325ull;
      const auto* p = static_cast<const unsigned char*>(a.recv);
      for (size_t i = 0; i < l.recv_count * ts; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
      std::vector<uint64_t> all(static_cast<size_t>(a.nranks));
      b.allgather(&h, all.data(), sizeof h);
      for (uint64_t x : all) r.wrong += x != all[0] ? 1 : 0;
    }
  } else if (o.check_iters > 0) {
    double wrong = 0;
    for (int c = 0; c < o.check_iters; ++c) {
      poison(a.dtype, a.recv, l.recv_count * ts);
      fill_input(m, a, l.send_count);
      s.coll.run(a);
      wrong += static_cast<double>(with_type(a.dtype, [&]<class T>(Tag<T>) {
        return check_typed(s.coll, l, m, a.op, a.rank, a.nranks, a.root, static_cast<const T*>(a.recv));
      }));
    }
    b.allreduce(&wrong, 1, Op::Sum);
    r.wrong = static_cast<int64_t>(wrong);
  }
  return r;
}

// The settings of this (the leader's) process: every CHORUS_* setting that is set, except those that say where this
// rank is in the launch (rank, size, rendezvous, secret), then each CHORUS_* variable that is not a setting, since a
// misspelt one changes nothing. `algorithm`: the -A flag, which takes precedence over CHORUS_ALGO.
void print_settings(const std::string& algorithm) {
  using chorus::Param;
  constexpr Param kLaunch[] = {Param::Rank,     Param::NRanks, Param::LocalRank,
                               Param::RootAddr, Param::Secret, Param::LaunchId};
  std::string line;
  for (const chorus::ParamInfo& p : chorus::params()) {
    if (std::find(std::begin(kLaunch), std::end(kLaunch), p.id) != std::end(kLaunch) || !chorus::param_is_set(p.id))
      continue;
    line += std::string(" ") + p.name + "=" + chorus::param_str(p.id);
    if (p.id == Param::Algo && !algorithm.empty()) line += " (-A comes first)";
  }
  std::printf("# settings:%s\n", line.empty() ? " defaults (no known CHORUS_* setting is set)" : line.c_str());
  for (const chorus::UnknownSetting& u : chorus::unknown_settings())
    std::printf("# %s is not a setting: ignored%s\n", u.name.c_str(), u.suggestion(" (", ")").c_str());
}

void print_header(const Options& o, const ToolInfo& tool, Backend& b, const std::vector<RankInfo>& infos) {
  std::printf("# %s: %s\n", tool.name.c_str(), b.describe().c_str());
  if (tool.flags.find('A') != std::string::npos)  // a Chorus tool (the baselines' algorithms are their own)
  {
    const char* rule = std::getenv("CHORUS_ALGO");
    std::printf(
        "# algorithm: %s%s%s\n",
        o.algorithm.empty() ? "chosen by the selector (the footer lists what each size ran)" : o.algorithm.c_str(),
        o.algorithm.empty() && rule && *rule ? ", CHORUS_ALGO=" : "", o.algorithm.empty() && rule && *rule ? rule : "");
    print_settings(o.algorithm);
  }
  if (o.compression != 0) {
    static const char* const kCodecNames[] = {"int8", "fp8_e4m3", "int4", "sign1", "sign_vote"};
    std::printf(
        "# compression: codec %s block %s%s (busbw: effective; #wrong: the relative L2 error against fp64 (sign_vote: "
        "the share of elements off the majority sign), or the number of ranks whose result differs from rank 0's)\n",
        kCodecNames[o.compression - 1], o.compression_block ? std::to_string(o.compression_block).c_str() : "default",
        o.compression_rotation ? " rotation" : "");
  }
  std::printf("# minBytes %zu maxBytes %zu step: ", o.min_bytes, o.max_bytes);
  if (o.step_factor > 1)
    std::printf("%d(factor)", o.step_factor);
  else
    std::printf("%zu(bytes)", o.step_bytes);
  std::printf(" warmup iters: %d iters: %d validation: %d blocking: %d time over ranks: %s\n", o.warmup_iters, o.iters,
              o.check_iters, o.blocking ? 1 : 0, average_name(o.average));
  std::printf("#\n# Ranks\n");
  for (const RankInfo& r : infos) std::printf("#  Rank %3d  Pid %7d  on %s  device host\n", r.rank, r.pid, r.host);
  print_table_header();
}

// Whether `path` can be written (created in its folder, or overwritten), without creating it. Sets errno if not.
bool can_write(const std::string& path) {
  struct stat st {};
  if (path.back() == '/' || (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))) {
    errno = EISDIR;
    return false;
  }
  if (access(path.c_str(), F_OK) == 0) return access(path.c_str(), W_OK) == 0;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  return access(dir.c_str(), W_OK | X_OK) == 0;
}

// The algorithms the rows ran, one line per dtype, op and root: size ranges (bytes) and the algorithm of each,
// out of place, then in place where that differs. Empty when no row names one (the baselines).
std::vector<std::string> algorithm_summary(const std::vector<Row>& rows) {
  std::vector<std::string> lines;
  for (size_t first = 0; first < rows.size();) {
    size_t end = first;
    while (end < rows.size() && rows[end].dtype == rows[first].dtype && rows[end].op == rows[first].op &&
           rows[end].root == rows[first].root && (end == first || rows[end].bytes > rows[end - 1].bytes))
      ++end;
    std::string ranges[2];
    for (int p = 0; p < 2; ++p) {
      for (size_t i = first; i < end;) {
        size_t j = i;
        while (j + 1 < end && rows[j + 1].place[p].algorithm == rows[i].place[p].algorithm) ++j;
        const std::string& name = rows[i].place[p].algorithm;
        if (!ranges[p].empty()) ranges[p] += ", ";
        ranges[p] += std::to_string(rows[i].bytes);
        if (j > i) ranges[p].append("-").append(std::to_string(rows[j].bytes));
        ranges[p].append(" ").append(name.empty() ? std::string("?") : name);
        i = j + 1;
      }
    }
    std::string line = std::string(dtype_name(rows[first].dtype));
    if (rows[first].op != Op::None) line += std::string(" ") + op_name(rows[first].op);
    if (rows[first].root >= 0) line += " root " + std::to_string(rows[first].root);
    line += ": " + ranges[0];
    if (ranges[1] != ranges[0]) line += "; in place: " + ranges[1];
    const bool named =
        std::any_of(rows.begin() + static_cast<std::ptrdiff_t>(first), rows.begin() + static_cast<std::ptrdiff_t>(end),
                    [](const Row& r) { return !r.place[0].algorithm.empty() || !r.place[1].algorithm.empty(); });
    if (named && std::find(lines.begin(), lines.end(), line) == lines.end())
      lines.push_back(line);  // -N cycles repeat lines
    first = end;
  }
  return lines;
}

bool write_json(const std::string& path, const std::vector<Row>& rows, const Collective& coll, int nranks) {
  nlohmann::json records = nlohmann::json::array();
  for (const Row& row : rows) {
    for (int p = 0; p < 2; ++p) {
      const Measured& m = row.place[p];
      nlohmann::json rec = {
          {"collective", coll.name()}, {"size", row.bytes}, {"count", row.elements}, {"type", dtype_name(row.dtype)},
          {"redop", op_name(row.op)},  {"root", row.root},  {"nranks", nranks},      {"inplace", p == 1},
          {"time_us", m.time_us},      {"algbw", m.algbw},  {"busbw", m.busbw},
      };
      rec["wrong"] = m.wrong < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.wrong);
      if (!m.algorithm.empty()) rec["algorithm"] = m.algorithm;
      if (m.rel_error >= 0) rec["rel_error"] = m.rel_error;
      records.push_back(std::move(rec));
    }
  }
  // Written in place (the path may be a symlink, a pipe or /dev/stdout); only a sweep that measured something writes.
  std::ofstream f(path);
  f << records.dump(2) << "\n";
  f.close();
  return static_cast<bool>(f);
}

}  // namespace

int run_sweep(const Options& opts, const ToolInfo& tool, const Collective& coll, Backend& b) {
  const int n = b.nranks();
  const int rank = b.rank();
  const bool leader = rank == 0;

  // The leader alone writes -J's file: it checks that it can before the sweep rather than after it, and tells the
  // other ranks with the first exchange below, so that every rank exits with the usage code.
  const bool json_refused = leader && !opts.json_path.empty() && !can_write(opts.json_path);
  if (json_refused)
    std::fprintf(stderr, "%s: invalid value '%s' for -J/--output_file: cannot write it: %s\n", tool.name.c_str(),
                 opts.json_path.c_str(), std::strerror(errno));

  if (coll.rooted() && opts.root >= n) {
    if (leader)
      std::fprintf(stderr,
                   "%s: invalid value '%d' for -r/--root: must be in [0, %d), or -1 or 'all' (every root in turn)\n",
                   tool.name.c_str(), opts.root, n);
    return kExitUsage;
  }

  std::vector<Row> rows;
  int64_t total_wrong = 0;
  double busbw_sum = 0;
  int busbw_samples = 0;
  try {
    RankInfo me;
    me.rank = rank;
    me.pid = static_cast<int32_t>(getpid());
    me.can_write_json = json_refused ? 0 : 1;
    gethostname(me.host, sizeof me.host - 1);
    std::vector<RankInfo> infos(static_cast<size_t>(n));
    b.allgather(&me, infos.data(), sizeof me);
    if (infos[0].can_write_json == 0) return kExitUsage;
    if (leader) print_header(opts, tool, b, infos);

    const std::vector<size_t> sizes = sweep_sizes(opts);
    size_t send_bytes = 0, recv_bytes = 0;
    for (chorusDataType_t dt : opts.dtypes) {
      const size_t ts = chorusTypeSize(dt);
      for (size_t bytes : sizes) {
        const Layout l = coll.layout(bytes, ts, n);
        send_bytes = std::max(send_bytes, l.send_count * ts);
        recv_bytes = std::max(recv_bytes, l.recv_count * ts);
      }
    }
    Buffer send = make_buffer(send_bytes), recv = make_buffer(recv_bytes);
    SweepState s{opts, coll, b, send.get(), recv.get()};
    if (!opts.algorithm.empty()) s.options.algorithm = opts.algorithm.c_str();
    if (opts.compression != 0) {
      s.compression.codec = static_cast<chorusCodec_t>(opts.compression);
      s.compression.block = opts.compression_block;
      s.compression.rotation = opts.compression_rotation ? 1 : 0;
      s.options.compression = &s.compression;
    }

    std::vector<int> roots;
    if (!coll.rooted())
      roots = {-1};
    else if (opts.root >= 0)
      roots = {opts.root};
    else
      for (int r = 0; r < n; ++r) roots.push_back(r);
    const std::vector<Op> ops = coll.reduces() ? opts.ops : std::vector<Op>{Op::None};

    for (int cycle = 0; cycle < opts.cycles; ++cycle) {
      for (chorusDataType_t dt : opts.dtypes) {
        const size_t ts = chorusTypeSize(dt);
        for (Op op : ops) {
          const DataModel model = make_model(op, dt, n);
          const chorusRedOp_t redop = coll.reduces() ? b.acquire_op(op, dt) : chorusSum;
          for (int root : roots) {
            size_t prev_elements = SIZE_MAX;
            for (size_t bytes : sizes) {
              const Layout l = coll.layout(bytes, ts, n);
              // Sizes that round down to the same element count (0 and 1 byte of floats) would repeat a row.
              if (l.elements == prev_elements) continue;
              prev_elements = l.elements;
              Row row;
              row.bytes = l.bytes;
              row.elements = l.elements;
              row.dtype = dt;
              row.op = op;
              row.root = root;
              for (int p = 0; p < 2; ++p) {
                OpArgs a = make_args(s, l, ts, p == 1);
                a.dtype = dt;
                a.op = op;
                a.redop = redop;
                a.root = root;
                row.place[p] = measure(s, l, ts, a, model);
                if (row.place[p].wrong > 0) total_wrong += row.place[p].wrong;
                busbw_sum += row.place[p].busbw;
                ++busbw_samples;
              }
              if (leader) print_row(row);
              rows.push_back(row);
            }
          }
          if (coll.reduces()) b.release_op(redop);
        }
      }
    }
  } catch (const PerfError& e) {
    std::fprintf(stderr, "%s: %s\n", tool.name.c_str(), e.what());
    std::fflush(stderr);
    b.abort();
    // What was measured before a failure is kept; a usage error measured nothing and leaves -J's file alone.
    if (leader && !opts.json_path.empty() && !e.usage && !rows.empty()) write_json(opts.json_path, rows, coll, n);
    return e.usage ? kExitUsage : kExitFailed;
  }

  int rc = kExitOk;
  if (leader) {
    std::printf("# Out of bounds values : %" PRId64 " %s\n", total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g\n", busbw_samples > 0 ? busbw_sum / busbw_samples : 0.0);
    const std::vector<std::string> algorithms = algorithm_summary(rows);
    if (!algorithms.empty()) std::printf("# Algorithm each measured size (bytes) ran, on rank 0:\n");
    for (const std::string& line : algorithms) std::printf("#   %s\n", line.c_str());
    std::printf("#\n");
    std::fflush(stdout);
    if (!opts.json_path.empty() && !write_json(opts.json_path, rows, coll, n)) {
      std::fprintf(stderr, "%s: cannot write %s: %s\n", tool.name.c_str(), opts.json_path.c_str(),
                   std::strerror(errno));
      rc = kExitFailed;
    }
  }
  if (total_wrong > 0) rc = kExitFailed;
  return rc;
}

// ---------------------------------------------------------------------------------------------------------------
// Chorus backend and main
// ---------------------------------------------------------------------------------------------------------------

namespace {

class ChorusBackend final : public Backend {
 public:
  ChorusBackend(chorusComm_t comm, std::string placement) : comm_(comm), placement_(std::move(placement)) {
    check_chorus(chorusCommUserRank(comm_, &rank_), "chorusCommUserRank", comm_, -1);
    check_chorus(chorusCommCount(comm_, &nranks_), "chorusCommCount", comm_, rank_);
  }
  ~ChorusBackend() override {
    if (comm_ != nullptr) chorusCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  chorusComm_t comm() const override { return comm_; }
  std::string last_algorithm() const override { return chorus::last_algorithm(comm_); }

  std::string describe() const override {
    int version = 0;
    chorusGetVersion(&version);
    return "Chorus " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
           std::to_string(version % 100) + ", nranks " + std::to_string(nranks_) + " (" + placement_ + ")";
  }

  void barrier() override { check_chorus(chorusBarrier(comm_, nullptr), "chorusBarrier", comm_, rank_); }

  void allreduce(double* values, size_t n, Op op) override {
    const chorusRedOp_t r = op == Op::Min ? chorusMin : op == Op::Max ? chorusMax : chorusSum;
    check_chorus(chorusAllReduce(values, values, n, chorusFloat64, r, comm_, nullptr), "chorusAllReduce (timings)",
                 comm_, rank_);
  }

  void allgather(const void* in, void* out, size_t bytes) override {
    check_chorus(chorusAllGather(in, out, bytes, chorusUint8, comm_, nullptr), "chorusAllGather (rank info)", comm_,
                 rank_);
  }

  chorusRedOp_t acquire_op(Op op, chorusDataType_t dtype) override {
    switch (op) {
      case Op::Sum: return chorusSum;
      case Op::Prod: return chorusProd;
      case Op::Max: return chorusMax;
      case Op::Min: return chorusMin;
      case Op::Avg: return chorusAvg;
      case Op::None: return chorusSum;
      case Op::PreMulSum: break;
    }
    alignas(8) unsigned char scalar[8] = {};
    with_type(dtype, [&]<class T>(Tag<T>) {
      const T v = from_int<T>(kPreMulScalar);
      std::memcpy(scalar, &v, sizeof v);
    });
    chorusRedOp_t r;
    check_chorus(chorusRedOpCreatePreMulSum(&r, scalar, dtype, chorusScalarHostImmediate, comm_),
                 "chorusRedOpCreatePreMulSum", comm_, rank_);
    return r;
  }

  void release_op(chorusRedOp_t redop) override {
    if (static_cast<int>(redop) >= chorusNumOps)
      check_chorus(chorusRedOpDestroy(redop, comm_), "chorusRedOpDestroy", comm_, rank_);
  }

  void abort() override {
    if (comm_ == nullptr) return;
    // A refused call (a bad argument) leaves the communicator healthy: destroyed, it says goodbye, so the peers
    // waiting for this rank hear that it left instead of logging that its process died. A broken one is aborted.
    chorusResult_t async = chorusSuccess;
    if (chorusCommGetAsyncError(comm_, &async) != chorusSuccess || async != chorusSuccess ||
        chorusCommDestroy(comm_) != chorusSuccess)
      chorusCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  chorusComm_t comm_;
  std::string placement_;
  int rank_ = 0;
  int nranks_ = 1;
};

// A launcher gave this process a rank: chorusrun (CHORUS_RANK) always counts; the others only when they started
// more than one process, so that e.g. a lone `mpirun -np 1 prog -t 4` still runs threads.
bool launcher_rank(int* rank) {
  if (const char* r = std::getenv("CHORUS_RANK")) {
    *rank = std::atoi(r);
    return true;
  }
  // CHORUS_NRANKS without CHORUS_RANK is a launch gone wrong, not a run of threads: the init says what is missing.
  if (const char* n = std::getenv("CHORUS_NRANKS"); n != nullptr && std::atoi(n) > 1) {
    *rank = 0;
    return true;
  }
  static const std::pair<const char*, const char*> kVars[] = {
      {"RANK", "WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"SLURM_PROCID", "SLURM_NTASKS"},
      {"PMI_RANK", "PMI_SIZE"},
  };
  for (const auto& [rank_var, size_var] : kVars) {
    const char* r = std::getenv(rank_var);
    const char* s = std::getenv(size_var);
    if (r != nullptr && s != nullptr && std::atoi(s) > 1) {
      *rank = std::atoi(r);
      return true;
    }
  }
  return false;
}

// Why -A `algorithm` cannot run on `coll` (compressed or not), or "" when it can. Whether it applies to the
// communicator's size (one-shot beyond 64 ranks) is the library's to say, at the first call.
std::string unknown_algorithm(const Collective& coll, const std::string& algorithm, bool compressed) {
  static const std::pair<const char*, algo::Coll> kColls[] = {{"all_reduce", algo::Coll::AllReduce},
                                                              {"all_gather", algo::Coll::AllGather},
                                                              {"reduce_scatter", algo::Coll::ReduceScatter},
                                                              {"broadcast", algo::Coll::Broadcast},
                                                              {"reduce", algo::Coll::Reduce},
                                                              {"alltoall", algo::Coll::AllToAll},
                                                              {"gather", algo::Coll::Gather},
                                                              {"scatter", algo::Coll::Scatter}};
  const auto* it = std::find_if(std::begin(kColls), std::end(kColls),
                                [&](const auto& c) { return coll.name() == std::string_view(c.first); });
  if (it == std::end(kColls)) return std::string(coll.name()) + " has no algorithms to choose from";
  if (compressed) {
    if (algo::find_compressed_algorithm(it->second, algorithm) != nullptr) return "";
    return "'" + algorithm + "' is not a compressed schedule for " + coll.name() +
           " (known: " + algo::compressed_algorithm_names(it->second) + ")";
  }
  if (algo::find_algorithm(it->second, algorithm) != nullptr) return "";
  return "'" + algorithm + "' is not an algorithm for " + coll.name() +
         " (known: " + algo::algorithm_names(it->second) + ")";
}

}  // namespace

int perf_main(int argc, char** argv, const Collective& coll) {
  const std::string name = std::string(coll.name()) + "_perf";
  const ToolInfo tool = chorus_tool(name);
  int env_rank = 0;
  const bool from_env = launcher_rank(&env_rank);

  Options opts;
  const int parsed = parse_options(argc, argv, tool, &opts, !from_env || env_rank == 0);
  if (parsed >= 0) return parsed;
  if (opts.compression != 0) {
    // Found before anything runs (the library would refuse each call), as every other bad flag.
    std::string bad;
    if (!coll.compressible())
      bad = std::string(coll.name()) + " has no compressed form (all_reduce, reduce_scatter and all_gather have)";
    else if (opts.compression == chorusCodecSignVote && std::string(coll.name()) != "all_reduce")
      bad = "sign_vote is an all-reduce (majority of signs): use all_reduce_perf";
    else if (std::any_of(opts.dtypes.begin(), opts.dtypes.end(), [](chorusDataType_t d) {
               return d != chorusFloat32 && d != chorusFloat16 && d != chorusBfloat16;
             }))
      bad = "needs -d float, half or bfloat16 (compressed collectives take float32, float16 or bfloat16 data)";
    else if (coll.reduces())
      for (Op op : opts.ops)
        if (op != Op::Sum && (op != Op::Avg || opts.compression == chorusCodecSignVote))
          bad = opts.compression == chorusCodecSignVote ? "sign_vote needs -o sum" : "needs -o sum or avg";
    if (!bad.empty()) {
      if (!from_env || env_rank == 0) std::fprintf(stderr, "%s: -Z/--compression: %s\n", name.c_str(), bad.c_str());
      return 2;
    }
  }
  if (!opts.algorithm.empty()) {
    // Found before anything runs, as -Z's: an algorithm the tool's collective (or its compressed form) lacks.
    const std::string bad = unknown_algorithm(coll, opts.algorithm, opts.compression != 0);
    if (!bad.empty()) {
      if (!from_env || env_rank == 0) std::fprintf(stderr, "%s: -A/--algorithm: %s\n", name.c_str(), bad.c_str());
      return 2;
    }
  }
  if (opts.timeout_s > 0) setenv("CHORUS_TIMEOUT_MS", std::to_string(int64_t{opts.timeout_s} * 1000).c_str(), 1);

  if (from_env) {
    if (opts.nthreads != 1) {
      if (env_rank == 0)
        std::fprintf(stderr, "%s: -t/--nthreads must be 1 when a launcher starts the ranks (one rank per process)\n",
                     name.c_str());
      return kExitUsage;
    }
    chorusComm_t comm = nullptr;
    const chorusResult_t r = chorusCommInitFromEnv(&comm);
    if (r != chorusSuccess) {
      std::fprintf(stderr, "%s: chorusCommInitFromEnv failed: %s (%s)\n", name.c_str(), chorusGetErrorString(r),
                   chorusGetLastError(nullptr));
      return kExitFailed;
    }
    try {
      int nranks = 0;
      chorusCommCount(comm, &nranks);
      ChorusBackend backend(comm, std::to_string(nranks) + " processes x 1 thread");
      return run_sweep(opts, tool, coll, backend);
    } catch (const PerfError& e) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
      return e.usage ? kExitUsage : kExitFailed;
    }
  }

  chorusUniqueId id;
  if (const chorusResult_t r = chorusGetUniqueId(&id); r != chorusSuccess) {
    std::fprintf(stderr, "%s: chorusGetUniqueId failed: %s (%s)\n", name.c_str(), chorusGetErrorString(r),
                 chorusGetLastError(nullptr));
    return kExitFailed;
  }
  const int nthreads = opts.nthreads;
  std::vector<int> rcs(static_cast<size_t>(nthreads), kExitFailed);
  std::vector<std::thread> threads;
  const std::string placement = "1 process x " + std::to_string(nthreads) + " thread" + (nthreads > 1 ? "s" : "");
  for (int t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      chorusComm_t comm = nullptr;
      const chorusResult_t r = chorusCommInitRank(&comm, nthreads, id, t);
      if (r != chorusSuccess) {
        std::fprintf(stderr, "%s: rank %d: chorusCommInitRank failed: %s (%s)\n", name.c_str(), t,
                     chorusGetErrorString(r), chorusGetLastError(nullptr));
        return;
      }
      try {
        ChorusBackend backend(comm, placement);
        rcs[static_cast<size_t>(t)] = run_sweep(opts, tool, coll, backend);
      } catch (const PerfError& e) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
        rcs[static_cast<size_t>(t)] = e.usage ? kExitUsage : kExitFailed;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  return *std::max_element(rcs.begin(), rcs.end());
}

}  // namespace chorus::perf
