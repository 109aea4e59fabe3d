#include "bootstrap/launch_env.h"

#include <openssl/evp.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {

struct Launcher {
  const char* source;
  const char* rank;
  const char* size;
  const char* size_alt;  // an older spelling, or nullptr
  const char* local_rank;
  const char* local_rank_alt;
};

// In detection order: mpirun inside a Slurm allocation sets SLURM_PROCID for its daemons, not for the ranks, so
// Open MPI is asked before Slurm; torchrun's RANK is the most specific of all.
constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", nullptr, "LOCAL_RANK", nullptr},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", nullptr, "OMPI_COMM_WORLD_LOCAL_RANK", nullptr},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", nullptr},
    {"pmi", "PMI_RANK", "PMI_SIZE", nullptr, "PMI_LOCAL_RANK", "MPI_LOCALRANKID"},
};

// Job identities a derived secret may come from, in order.
constexpr const char* kJobIds[] = {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"};

constexpr const char* kAllVariables[] = {
    "CHORUS_RANK",
    "CHORUS_NRANKS",
    "CHORUS_LOCAL_RANK",
    "CHORUS_ROOT_ADDR",
    "CHORUS_SECRET",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_MCA_ess_base_jobid",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_LOCALID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMIX_NAMESPACE",
};

[[noreturn]] void bad(const std::string& text) { throw Error(chorusInvalidArgument, Subsys::Bootstrap, text); }

std::optional<std::string> env(const char* name) {
  const char* v = name != nullptr ? std::getenv(name) : nullptr;
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& text, const char* name) {
  // The whole text is the number: no space or '+' around it (from_chars takes neither), as the settings parse.
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) bad(cat(name, "='", text, "' is out of range for an int"));
  if (ec != std::errc() || end != text.data() + text.size()) bad(cat(name, "='", text, "' is not an integer"));
  return v;
}

int parse_port(const std::string& text, const char* name) {
  const int port = parse_int(text, name);
  if (port < 1 || port > 65535) bad(cat(name, "='", text, "': port ", port, " is out of range [1, 65535]"));
  return port;
}

// A value from its CHORUS_* override, else from the launcher's variable (or its alternative spelling).
struct Value {
  int value = -1;
  const char* name = nullptr;  // the variable it came from; nullptr when none is set
};

Value pick(Param override, const char* launcher_var, const char* launcher_alt) {
  const char* oname = param_info(override).name;
  if (auto v = env(oname)) return {parse_int(*v, oname), oname};
  for (const char* name : {launcher_var, launcher_alt})
    if (auto v = env(name)) return {parse_int(*v, name), name};
  return {};
}

std::string derive_input(const std::string& name, const std::string& value, const std::string& root) {
  return cat("chorus-derived-secret", '\0', name, '=', value, '\0', root);
}

Secret derive_secret(const std::string& input) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(input.data(), input.size(), digest, &len, EVP_sha256(), nullptr) != 1 || len < sizeof(Secret))
    throw Error(chorusSystemError, Subsys::Bootstrap, "OpenSSL SHA-256 failed");
  Secret s{};
  std::memcpy(s.data(), digest, s.size());
  return s;
}

}  // namespace

std::span<const char* const> launch_env_variables() { return kAllVariables; }

std::pair<std::string, int> parse_host_port(const std::string& text, const char* what) {
  std::string host, port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      bad(cat(what, "='", text, "' is not [address]:port"));
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) bad(cat(what, "='", text, "' is not host:port (the port is missing)"));
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      bad(cat(what, "='", text, "': write an IPv6 address in brackets, as [address]:port"));
  }
  if (host.empty()) bad(cat(what, "='", text, "' has an empty host"));
  int port = parse_int(port_text, what);
  if (port < 1 || port > 65535) bad(cat(what, "='", text, "': port ", port, " is out of range [1, 65535]"));
  return {host, port};
}

std::string slurm_first_host(const std::string& nodelist, const char* what) {
  // The first item at bracket depth 0, with every bracket group replaced by its first number.
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    char c = nodelist[i];
    if (c == ']') bad(cat(what, "='", nodelist, "' has an unmatched ']'"));
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    size_t close = nodelist.find(']', i);
    if (close == std::string::npos) bad(cat(what, "='", nodelist, "' has an unmatched '['"));
    std::string group = nodelist.substr(i + 1, close - i - 1);
    std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      bad(cat(what, "='", nodelist, "': cannot read the range [", group, "]"));
    host += first;
    i = close + 1;
  }
  if (host.empty()) bad(cat(what, "='", nodelist, "' names no host"));
  return host;
}

LaunchEnv read_launch_env() {
  LaunchEnv out;
  const Launcher* launcher = nullptr;
  for (const Launcher& l : kLaunchers) {
    if (env(l.rank)) {
      launcher = &l;
      break;
    }
  }
  static constexpr Launcher kNoLauncher = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  const Launcher& l = launcher != nullptr ? *launcher : kNoLauncher;
  Value rank = pick(Param::Rank, l.rank, nullptr);
  Value nranks = pick(Param::NRanks, l.size, l.size_alt);
  Value local = pick(Param::LocalRank, l.local_rank, l.local_rank_alt);
  if (rank.name == nullptr)
    bad("cannot tell this process's rank: set CHORUS_RANK, CHORUS_NRANKS, CHORUS_ROOT_ADDR and CHORUS_SECRET, or "
        "start it with chorusrun, torchrun, mpirun, srun or a PMI launcher");
  if (nranks.name == nullptr)
    bad(launcher != nullptr && !param_is_set(Param::Rank)
            ? cat(launcher->rank, " is set (", launcher->source, ") but ", launcher->size, " is not")
            : std::string("CHORUS_RANK is set but CHORUS_NRANKS is not"));
  if (nranks.value < 1) bad(cat(nranks.name, "=", nranks.value, " must be at least 1"));
  if (rank.value < 0 || rank.value >= nranks.value)
    bad(cat(rank.name, "=", rank.value, " is out of range for ", nranks.name, "=", nranks.value));
  if (local.name != nullptr && local.value < 0) bad(cat(local.name, "=", local.value, " must not be negative"));
  out.rank = rank.value;
  out.nranks = nranks.value;
  out.local_rank = local.name != nullptr ? local.value : -1;
  out.source = param_is_set(Param::Rank) ? "chorus" : launcher->source;

  // Root address.
  const auto master_addr = env("MASTER_ADDR");
  const auto master_port = env("MASTER_PORT");
  const auto slurm_nodes = env("SLURM_JOB_NODELIST") ? env("SLURM_JOB_NODELIST") : env("SLURM_NODELIST");
  const char* slurm_nodes_name = env("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
  const auto slurm_job = env("SLURM_JOB_ID");
  if (param_is_set(Param::RootAddr)) {
    std::tie(out.root_host, out.root_port) = parse_host_port(param_str(Param::RootAddr), "CHORUS_ROOT_ADDR");
    out.root_from = "CHORUS_ROOT_ADDR";
  } else if (master_addr) {
    if (!master_port) bad("MASTER_ADDR is set but MASTER_PORT is not");
    out.root_host = *master_addr;
    out.root_port = parse_port(*master_port, "MASTER_PORT");
    out.root_from = "MASTER_ADDR/MASTER_PORT";
  } else if (slurm_nodes && slurm_job) {
    out.root_host = slurm_first_host(*slurm_nodes, slurm_nodes_name);
    if (master_port) {
      out.root_port = parse_port(*master_port, "MASTER_PORT");
      out.root_from = cat(slurm_nodes_name, "/MASTER_PORT");
    } else {
      int job = parse_int(*slurm_job, "SLURM_JOB_ID");
      if (job < 0) bad(cat("SLURM_JOB_ID=", job, " must not be negative"));
      // Every rank computes the same port without talking; the job id spreads concurrent jobs on one node.
      out.root_port = 29500 + job % 1000;
      out.root_from = cat(slurm_nodes_name, "/SLURM_JOB_ID (port 29500 + SLURM_JOB_ID % 1000)");
    }
  } else {
    bad(master_port ? std::string("MASTER_PORT is set but MASTER_ADDR is not")
                    : std::string("no rendezvous address: set CHORUS_ROOT_ADDR=host:port (or MASTER_ADDR and "
                                  "MASTER_PORT)"));
  }

  // Secret.
  if (param_is_set(Param::Secret)) {
    out.secret = parse_secret(param_str(Param::Secret), "CHORUS_SECRET");
    return out;
  }
  const std::string root = cat(out.root_host, ":", out.root_port);
  for (const char* name : kJobIds) {
    auto value = env(name);
    if (!value) continue;
    std::string id = *value;
    if (std::strcmp(name, "SLURM_JOB_ID") == 0) id += cat(".", env("SLURM_STEP_ID").value_or(""));
    out.secret = derive_secret(derive_input(name, id, root));
    CHORUS_WARN(Bootstrap,
                "CHORUS_SECRET is not set: derived the bootstrap secret from %s and the root address %s. That keeps "
                "concurrent jobs apart but is not a secret (anyone who can see the job id can join); set "
                "CHORUS_SECRET to 32 hex digits shared by every rank to authenticate for real",
                name, root.c_str());
    return out;
  }
  bad("CHORUS_SECRET is not set and the launcher gives no job id to derive one from: set CHORUS_SECRET to 32 hex "
      "digits shared by every rank (e.g. from `openssl rand -hex 16`)");
}

}  // namespace chorus
