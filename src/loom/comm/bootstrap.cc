#include "loom/comm/bootstrap.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "loom/comm/net/socket.h"
#include "loom/comm/store/tcp_store.h"
#include "loom/core/checksum.h"
#include "loom/core/cpus.h"
#include "loom/core/error.h"
#include "loom/core/hmac.h"
#include "loom/core/log.h"
#include "loom/core/tunable.h"

namespace loom::comm {
namespace {

const StringTunable kStore("LOOM_STORE", "", "rendezvous store, tcp://host:port");
const IntTunable kStoreExternal("LOOM_STORE_EXTERNAL", 0,
                                "1 when a launcher hosts the store (rank 0 then does not)");
const StringTunable kBind("LOOM_BIND", "none",
                          "cores: pin each local rank to its own share of the cores; none");

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0)
    throw UserError(std::string(name) + "='" + v + "' is not a non-negative integer",
                    "check the launcher's environment");
  return static_cast<int>(x);
}

uint16_t port_for_job(const std::string& job_id) {
  return static_cast<uint16_t>(29500 + fnv1a64(job_id) % 1000);
}

// A single-machine job without a token: rank 0 generates one and hands it over through a
// private file named after the job.
std::string token_dir() {
  return "/tmp/loom-" + std::to_string(::getuid());
}

std::string token_path(const LaunchInfo& info, const std::string& store_url) {
  std::string id = info.job_id.empty() ? store_url : info.job_id;
  for (auto& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return token_dir() + "/token-" + id;
}

std::string local_token(const LaunchInfo& info, const std::string& store_url, Deadline deadline) {
  std::string dir = token_dir();
  std::string path = token_path(info, store_url);
  if (info.rank == 0) {
    ::mkdir(dir.c_str(), 0700);
    std::string token = generate_token();
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd < 0) throw Error("cannot write the job token file " + tmp + ": " + errno_text(errno));
      ssize_t w = ::write(fd, token.data(), token.size());
      ::close(fd);
      if (w != static_cast<ssize_t>(token.size())) throw Error("short write to " + tmp);
    }
    std::filesystem::rename(tmp, path);
    return token;
  }
  while (!deadline.expired()) {
    std::ifstream f(path);
    std::string token;
    if (f && std::getline(f, token) && token.size() == 64) return token;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw UserError("no LOOM_JOB_TOKEN and rank 0 did not publish one in " + path,
                  "set LOOM_JOB_TOKEN to the same secret on every rank");
}

}  // namespace

std::string first_slurm_host(const std::string& list) {
  auto bracket = list.find('[');
  auto comma = list.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return list.substr(0, comma);
  std::string prefix = list.substr(0, bracket);
  std::string inside = list.substr(bracket + 1);
  size_t stop = inside.find_first_of("-,]");
  return prefix + inside.substr(0, stop);
}

int slurm_tasks_on_node(const std::string& spec, int node) {
  auto bad = [&] {
    return UserError("SLURM_STEP_TASKS_PER_NODE='" + spec + "' is not a list of task counts",
                     "expected Slurm's form, e.g. 2(x2) or 2,1");
  };
  // The whole list is read first: a malformed one fails on every node alike.
  std::vector<std::pair<int, int>> groups;  // (tasks per node, nodes)
  size_t at = 0;
  auto number = [&](size_t& pos) {
    size_t end = pos;
    while (end < spec.size() && std::isdigit(static_cast<unsigned char>(spec[end]))) ++end;
    if (end == pos || end - pos > 6) throw bad();
    const int v = std::stoi(spec.substr(pos, end - pos));
    pos = end;
    return v;
  };
  do {
    if (!groups.empty() && spec[at++] != ',') throw bad();
    const int count = number(at);
    int repeat = 1;
    if (spec.compare(at, 2, "(x") == 0) {
      at += 2;
      repeat = number(at);
      if (at >= spec.size() || spec[at++] != ')') throw bad();
    }
    if (count < 1 || repeat < 1) throw bad();
    groups.push_back({count, repeat});
  } while (at < spec.size());
  int first = 0;  // the first node of the group
  for (const auto& [count, repeat] : groups) {
    if (node < first + repeat) return count;
    first += repeat;
  }
  throw UserError("SLURM_NODEID=" + std::to_string(node) + " is past the " + std::to_string(first) +
                      " node(s) of SLURM_STEP_TASKS_PER_NODE='" + spec + "'",
                  "run the ranks with srun, which sets both for the step");
}

LaunchInfo launch_info_from_env() {
  LaunchInfo i;
  if (env("LOOM_RANK") || env("LOOM_WORLD_SIZE")) {
    i.source = "loom";
    i.rank = env_int("LOOM_RANK", 0);
    i.size = env_int("LOOM_WORLD_SIZE", 1);
    i.local_rank = env_int("LOOM_LOCAL_RANK", i.rank);
    i.local_size = env_int("LOOM_LOCAL_WORLD_SIZE", i.size);
    if (const char* j = env("LOOM_JOB_ID")) i.job_id = j;
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    i.source = "mpirun";
    i.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    i.size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    i.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    i.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", i.size);
    if (const char* j = env("PMIX_NAMESPACE"))
      i.job_id = j;
    else if (const char* j2 = env("OMPI_MCA_ess_base_jobid"))
      i.job_id = j2;
  } else if (env("SLURM_PROCID")) {
    i.source = "slurm";
    i.rank = env_int("SLURM_PROCID", 0);
    i.size = env_int("SLURM_NTASKS", 1);
    i.local_rank = env_int("SLURM_LOCALID", 0);
    const int nodes =
        env_int("SLURM_STEP_NUM_NODES", env_int("SLURM_JOB_NUM_NODES", env_int("SLURM_NNODES", 1)));
    // This node's ranks: the step's per-node task counts ("2(x2)", "2,1": srun -n 3 puts
    // 2 on the first node and 1 on the second), SLURM_NTASKS_PER_NODE only where given
    // (--ntasks-per-node; absent otherwise).
    const char* spec = env("SLURM_STEP_TASKS_PER_NODE");
    if (!spec) spec = env("SLURM_TASKS_PER_NODE");
    if (nodes <= 1)
      i.local_size = i.size;
    else if (spec && env("SLURM_NODEID"))
      i.local_size = slurm_tasks_on_node(spec, env_int("SLURM_NODEID", 0));
    else if (env("SLURM_NTASKS_PER_NODE"))
      i.local_size = env_int("SLURM_NTASKS_PER_NODE", 1);
    else
      throw UserError("a Slurm job on " + std::to_string(nodes) +
                          " nodes without SLURM_STEP_TASKS_PER_NODE and SLURM_NODEID, or "
                          "SLURM_NTASKS_PER_NODE: the ranks per machine are unknown",
                      "start the ranks with srun, or pass --ntasks-per-node");
    if (i.local_rank >= i.local_size)
      throw UserError("SLURM_LOCALID=" + std::to_string(i.local_rank) + " is not below the " +
                          std::to_string(i.local_size) + " task(s) Slurm gives this node",
                      "start the ranks with srun");
    std::string job = env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "";
    if (env("SLURM_STEP_ID")) job += std::string(".") + env("SLURM_STEP_ID");
    i.job_id = job;
  }
  if (i.size < 1 || i.rank >= i.size)
    throw UserError("rank " + std::to_string(i.rank) + " is outside world size " +
                        std::to_string(i.size) + " (from the " + i.source + " environment)",
                    "ranks run from 0 to size-1");
  return i;
}

// Rank 0 of a step runs on the step's first node: its name, if this machine resolves it;
// else (node names outside DNS) the address of the node srun was started on, which is the
// first node when srun runs inside the allocation (sbatch, salloc on a compute node).
static std::string slurm_store_host() {
  const char* list = env("SLURM_STEP_NODELIST");
  if (!list) list = env("SLURM_JOB_NODELIST");
  if (!list)
    throw UserError("a Slurm job without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST",
                    "set MASTER_ADDR to the address of rank 0's node");
  const std::string host = first_slurm_host(list);
  if (net::resolves(host)) return host;
  if (const char* ip = env("SLURM_LAUNCH_NODE_IPADDR")) {
    LOOM_LOG(kInfo, "comm") << "the first node '" << host
                            << "' does not resolve; using SLURM_LAUNCH_NODE_IPADDR " << ip
                            << " for the store";
    return ip;
  }
  throw UserError(
      "the store host '" + host +
          "' (the first node of the Slurm step) does not resolve on this machine",
      "set MASTER_ADDR to the address of rank 0's node (or LOOM_STORE=tcp://ADDR:PORT)");
}

std::string store_url_from_env(const LaunchInfo& info) {
  std::string s = kStore.get();
  if (!s.empty()) return s;
  std::string host = "127.0.0.1";
  if (const char* a = env("MASTER_ADDR"))
    host = a;
  else if (info.source == "slurm")
    host = slurm_store_host();
  else if (info.source == "mpirun" && info.local_size < info.size)
    throw UserError("an mpirun job across machines (" + std::to_string(info.local_size) + " of " +
                        std::to_string(info.size) +
                        " ranks on this one) without MASTER_ADDR: the store's address is unknown",
                    "pass rank 0's machine address to every rank: mpirun -x MASTER_ADDR=ADDR "
                    "(and -x LOOM_JOB_TOKEN)");
  uint16_t port = 29500;
  if (const char* p = env("MASTER_PORT"))
    port = static_cast<uint16_t>(env_int("MASTER_PORT", 29500)), (void)p;
  else if (!info.job_id.empty())
    port = port_for_job(info.job_id);
  return "tcp://" + host + ":" + std::to_string(port);
}

// LOOM_BIND=cores: local rank k of m gets cores [k*c, (k+1)*c) of the CPUs this process may
// use, c = cpus/m, so the scheduler cannot put two ranks on one core. Off by default: the
// rare co-location it prevents is already bounded by the waiting ranks' short, time-limited
// spin (exec.cc), and a launcher that binds (Slurm, mpirun) does it itself. (It once doubled
// small-message latency, 8 B allreduce 0.43 -> 0.9 us: the topology then counted one CPU per
// bound rank, called the host oversubscribed and stopped spinning; equal since, 0.58-0.69 us.)
void bind_local_rank(const LaunchInfo& info) {
  std::string mode = kBind.get();
  if (mode != "cores" && mode != "none")
    throw UserError("LOOM_BIND='" + mode + "' is not a binding", "use cores or none");
  if (mode == "none") return;
  const std::vector<int> cpus = cpus_allowed();
  const int m = info.local_size, k = info.local_rank;
  if (m < 1 || m > static_cast<int>(cpus.size()) || k < 0 || k >= m) return;
  const int per = static_cast<int>(cpus.size()) / m;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  for (int i = k * per; i < (k + 1) * per; ++i) CPU_SET(cpus[i], &mine);
  // Every thread that exists now; threads created later inherit their creator's set.
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    sched_setaffinity(std::atoi(e.path().filename().c_str()), sizeof mine, &mine);
  LOOM_LOG(kInfo, "comm") << "local rank " << k << " bound to " << per << " core(s) from cpu "
                          << cpus[k * per];
}

// Why: the launcher hosts the store and carries the ranks' output, and ranks that outlived
// it trained on, unseen, to the end of the job (found by the fault campaign, tests/chaos:
// kill -9 of the launcher).
void follow_launcher() {
  const char* p = std::getenv("LOOM_LAUNCHER_PID");
  if (!p || !*p) return;
  const pid_t launcher = static_cast<pid_t>(std::atol(p));
  if (::getppid() != launcher) {
    if (::kill(launcher, 0) != 0 && errno == ESRCH)
      throw PeerError(PeerError::Kind::kDead, "the launcher (pid " + std::string(p) +
                                                  ") that started this rank and "
                                                  "hosts its store has exited");
    return;
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::raise(SIGKILL);  // it died between the check and prctl
}

std::shared_ptr<Communicator> init_from_env(CommConfig cfg) {
  follow_launcher();
  LaunchInfo info = launch_info_from_env();
  log::set_rank(info.rank);
  bind_local_rank(info);
  std::string url = store_url_from_env(info);
  net::HostPort addr = net::parse_host_port(url, "LOOM_STORE");
  Deadline deadline = Deadline::after_seconds(cfg.timeout_s);
  std::string token_file;
  if (cfg.token.empty()) {
    if (info.local_size != info.size)
      throw UserError("LOOM_JOB_TOKEN is not set for a job that spans several machines",
                      "export the same random secret as LOOM_JOB_TOKEN on every rank");
    if (info.size == 1) {
      cfg.token = generate_token();
    } else {
      cfg.token = local_token(info, url, deadline);
      token_file = token_path(info, url);
    }
  }
  std::shared_ptr<TcpStoreServer> server;
  if (info.rank == 0 && kStoreExternal.get() == 0)
    server = std::make_shared<TcpStoreServer>(addr.host, addr.port, cfg.token);
  auto store = std::make_shared<TcpStore>(addr, cfg.token, deadline);
  auto comm = Communicator::create(store, info.rank, info.size, std::move(cfg));
  // Every rank has joined (create ends with a barrier), so the token file has done its job.
  if (info.rank == 0 && !token_file.empty()) std::filesystem::remove(token_file);
  if (server) comm->hold(server);
  return comm;
}

}  // namespace loom::comm
