// The one config registry: every CHORUS_* environment variable is declared once in config.cc with its type,
// default and documentation; chorus-info prints the table. Values are read from the environment at each call
// (callers read them once, at communicator creation). A CHORUS_* variable the registry does not declare is
// reported (unknown_settings), since nothing reads it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace chorus {

enum class Param : int {
  Debug,
  DebugSubsys,
  DebugFile,
  TimeoutMs,
  Transports,
  SocketIfname,
  UcxTls,
  IbHca,
  IbGidIndex,
  IbQpsPerConnection,
  CudaDirect,
  SliceBytes,
  FifoDepth,
  NChannels,
  YieldUs,
  TopoFile,
  TopoDumpFile,
  TuneFile,
  Algo,
  Deterministic,
  Fp32Partials,
  Rank,
  NRanks,
  LocalRank,
  RootAddr,
  Secret,
  LaunchId,
  Count
};

struct ParamInfo {
  Param id;
  const char* name;      // environment variable
  const char* type;      // "int", "string", "size" (bytes; accepts K, M, G suffixes)
  const char* fallback;  // default as text ("" for none)
  const char* doc;
};

std::span<const ParamInfo> params();
const ParamInfo& param_info(Param p);
// The variable's value, or its default. Throws chorus::Error (InvalidArgument, naming the variable) when the text
// does not parse as the declared type.
std::string param_str(Param p);
int64_t param_int(Param p);
bool param_is_set(Param p);

// The settings that shape programs, read and checked as the communicator takes them (chorus-plan uses the same):
// CHORUS_SLICE_BYTES in [64, 1G]; CHORUS_FIFO_DEPTH a power of two in [2, 64] (steps that receive and send need 2;
// slot = counter % depth must stay consistent when 32-bit counters wrap); CHORUS_NCHANNELS in [1, 32]. Throw
// chorus::Error (InvalidArgument) naming the variable and the range.
size_t slice_bytes_setting();
int fifo_depth_setting();
int nchannels_setting();
// A setting that is 0 or 1 (CHORUS_DETERMINISTIC, CHORUS_FP32_PARTIALS): anything else is chorusInvalidArgument
// naming it.
bool switch_setting(Param p);

// A CHORUS_* environment variable that is not a setting of params(), so nothing reads it: usually a misspelt
// setting, which would otherwise be silently ignored.
struct UnknownSetting {
  std::string name;
  // The settings nearest in spelling, letter case ignored, at most 3 edits away (CHORUS_FP32_PARTIAL:
  // CHORUS_FP32_PARTIALS; CHORUS_nchannels: CHORUS_NCHANNELS); all of them when several are equally near
  // (CHORUS_NRANK: CHORUS_RANK and CHORUS_NRANKS). Empty when none is that near.
  std::vector<std::string> nearest;
  // `before` "did you mean A?" `after` (or "... A or B?"); "" when `nearest` is empty.
  std::string suggestion(const char* before = "", const char* after = "") const;
};
// The unknown CHORUS_* variables set now (each once, sorted by name). CHORUS_BUILD, the build folder Chorus's
// scripts take, is not reported. Reads the environment: safe from several threads as long as none changes the
// environment meanwhile (setenv).
std::vector<UnknownSetting> unknown_settings();
// Logs a CHORUS_WARN for each unknown_settings() entry, the first time it is called in the process; the inits
// (chorusCommInitRank, chorusCommInitFromEnv) and chorus-plan call it first thing. Thread-safe.
void warn_unknown_settings_once();

// Parses "64", "64K", "4M", "1G" (powers of 1024). Throws InvalidArgument naming `what` on bad text.
int64_t parse_size(const std::string& text, const char* what);

}  // namespace chorus
