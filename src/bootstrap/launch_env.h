// Rank, size and rendezvous point from the environment that a launcher set up: CHORUS_* first (chorusrun, or by
// hand), else torchrun, Open MPI, Slurm or PMI. Chorus only reads these; the launcher places the processes.
#pragma once

#include <span>
#include <string>
#include <utility>

#include "bootstrap/unique_id.h"

namespace chorus {

struct LaunchEnv {
  int rank = -1;
  int nranks = 0;
  int local_rank = -1;    // rank within this host; -1 when the launcher does not say
  std::string root_host;  // where rank 0 serves the rendezvous (a name or an address)
  int root_port = 0;
  std::string root_from;  // the variable(s) the root address came from, for errors: "MASTER_ADDR/MASTER_PORT", ...
  Secret secret{};
  std::string source;  // who gave the rank: "chorus", "torchrun", "openmpi", "slurm" or "pmi"
};

// Reads the launch environment. Each value comes from its CHORUS_* variable when set, else from the launcher that
// set this process's rank (checked in the order torchrun, Open MPI, Slurm, PMI):
//  - rank / nranks / local_rank: CHORUS_RANK / CHORUS_NRANKS / CHORUS_LOCAL_RANK, else RANK / WORLD_SIZE /
//    LOCAL_RANK, OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}, SLURM_{PROCID,NTASKS,LOCALID}, PMI_{RANK,SIZE,LOCAL_RANK}.
//  - root: CHORUS_ROOT_ADDR (host:port or [v6addr]:port), else MASTER_ADDR and MASTER_PORT, else under Slurm the
//    first host of SLURM_JOB_NODELIST with MASTER_PORT or 29500 + SLURM_JOB_ID % 1000.
//  - secret: CHORUS_SECRET (32 hex digits), else derived with SHA-256 from the launcher's job identity
//    (TORCHELASTIC_RUN_ID, SLURM_JOB_ID and SLURM_STEP_ID, OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE) and the root
//    address, with a warning: that keeps concurrent jobs apart but is not a secret.
// Throws chorusInvalidArgument naming the variable that is missing or malformed. Reads the environment at each
// call; not safe against a concurrent setenv.
LaunchEnv read_launch_env();

// Every environment variable read_launch_env() may read (for tests and chorus-info).
std::span<const char* const> launch_env_variables();

// The first host of a Slurm node list: "node[01-04,07],gpu3" -> "node01", "a[1-2]-b[5,7]" -> "a1-b5".
// Throws chorusInvalidArgument naming `what` when the list is empty or its brackets are malformed.
std::string slurm_first_host(const std::string& nodelist, const char* what = "SLURM_JOB_NODELIST");

// "host:port" or "[v6addr]:port" -> (host without brackets, port in 1..65535). Throws chorusInvalidArgument
// naming `what` otherwise.
std::pair<std::string, int> parse_host_port(const std::string& text, const char* what);

}  // namespace chorus
