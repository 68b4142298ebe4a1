// Reading the launcher's environment: loom, OpenMPI and Slurm variables, and their errors.
#include "loom/comm/bootstrap.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "loom/core/error.h"

namespace loom::comm {
namespace {

class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* v : {"LOOM_RANK",
                          "LOOM_WORLD_SIZE",
                          "LOOM_LOCAL_RANK",
                          "LOOM_LOCAL_WORLD_SIZE",
                          "LOOM_STORE",
                          "LOOM_JOB_ID",
                          "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "PMIX_NAMESPACE",
                          "SLURM_PROCID",
                          "SLURM_NTASKS",
                          "SLURM_LOCALID",
                          "SLURM_JOB_NUM_NODES",
                          "SLURM_NTASKS_PER_NODE",
                          "SLURM_JOB_ID",
                          "SLURM_STEP_ID",
                          "SLURM_JOB_NODELIST",
                          "SLURM_STEP_NODELIST",
                          "SLURM_STEP_NUM_NODES",
                          "SLURM_NNODES",
                          "SLURM_STEP_TASKS_PER_NODE",
                          "SLURM_TASKS_PER_NODE",
                          "SLURM_NODEID",
                          "SLURM_LAUNCH_NODE_IPADDR",
                          "MASTER_ADDR",
                          "MASTER_PORT"})
      unsetenv(v);
    for (auto& [k, v] : vars) setenv(k, v, 1), set_.push_back(k);
  }
  ~Env() {
    for (auto* k : set_) unsetenv(k);
  }

 private:
  std::vector<const char*> set_;
};

TEST(Bootstrap, SingleProcessByDefault) {
  Env e({});
  LaunchInfo i = launch_info_from_env();
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.size, 1);
  EXPECT_EQ(store_url_from_env(i), "tcp://127.0.0.1:29500");
}

TEST(Bootstrap, LoomVariables) {
  Env e({{"LOOM_RANK", "3"},
         {"LOOM_WORLD_SIZE", "8"},
         {"LOOM_LOCAL_RANK", "1"},
         {"LOOM_LOCAL_WORLD_SIZE", "2"},
         {"LOOM_STORE", "tcp://10.0.0.1:1234"}});
  LaunchInfo i = launch_info_from_env();
  EXPECT_EQ(i.source, "loom");
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.local_rank, 1);
  EXPECT_EQ(i.local_size, 2);
  EXPECT_EQ(store_url_from_env(i), "tcp://10.0.0.1:1234");
}

TEST(Bootstrap, OpenMpiVariables) {
  Env e({{"OMPI_COMM_WORLD_RANK", "2"},
         {"OMPI_COMM_WORLD_SIZE", "4"},
         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
         {"PMIX_NAMESPACE", "prterun-host-123@1"},
         {"MASTER_ADDR", "head"}});
  LaunchInfo i = launch_info_from_env();
  EXPECT_EQ(i.source, "mpirun");
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.size, 4);
  EXPECT_EQ(i.local_size, 2);
  std::string url = store_url_from_env(i);
  EXPECT_EQ(url.rfind("tcp://head:", 0), 0u) << url;  // port derived from the job id
}

TEST(Bootstrap, SlurmVariables) {
  Env e({{"SLURM_PROCID", "5"},
         {"SLURM_NTASKS", "8"},
         {"SLURM_LOCALID", "1"},
         {"SLURM_JOB_NUM_NODES", "2"},
         {"SLURM_NTASKS_PER_NODE", "4"},
         {"SLURM_JOB_ID", "991"},
         {"SLURM_JOB_NODELIST", "localhost,gpu08"}});
  LaunchInfo i = launch_info_from_env();
  EXPECT_EQ(i.source, "slurm");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.local_size, 4);
  EXPECT_EQ(i.job_id, "991");
  EXPECT_EQ(store_url_from_env(i).rfind("tcp://localhost:", 0), 0u);
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("n[1,3-5]"), "n1");
  EXPECT_EQ(first_slurm_host("solo"), "solo");
}

// srun -N 2 -n 3 (no --ntasks-per-node): SLURM_NTASKS_PER_NODE is absent; the step's
// per-node counts say 2 on the first node and 1 on the second (issue 34: local size 0 and
// a floating-point exception on every rank before).
TEST(Bootstrap, SlurmUnevenStepReadsTheStepsTaskCounts) {
  EXPECT_EQ(slurm_tasks_on_node("2(x2)", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x2)", 1), 2);
  EXPECT_EQ(slurm_tasks_on_node("2,1", 1), 1);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 1), 3);
  EXPECT_EQ(slurm_tasks_on_node("3(x2),1", 2), 1);
  for (const char* bad : {"", "x", "2(x", "2(x0)", "2;1", "0"})
    EXPECT_THROW(slurm_tasks_on_node(bad, 0), UserError) << bad;
  EXPECT_THROW(slurm_tasks_on_node("2(x2)", 2), UserError);
  {
    Env e({{"SLURM_PROCID", "2"},
           {"SLURM_NTASKS", "3"},
           {"SLURM_LOCALID", "0"},
           {"SLURM_JOB_NUM_NODES", "2"},
           {"SLURM_STEP_NUM_NODES", "2"},
           {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
           {"SLURM_NODEID", "1"},
           {"SLURM_STEP_NODELIST", "localhost,node2"}});
    LaunchInfo i = launch_info_from_env();
    EXPECT_EQ(i.local_size, 1);
  }
  {
    Env e({{"SLURM_PROCID", "1"},
           {"SLURM_NTASKS", "3"},
           {"SLURM_LOCALID", "1"},
           {"SLURM_JOB_NUM_NODES", "2"}});  // nothing says how many ranks share this node
    try {
      launch_info_from_env();
      ADD_FAILURE() << "no per-node count was accepted";
    } catch (const UserError& err) {
      EXPECT_NE(std::string(err.what()).find("ranks per machine are unknown"), std::string::npos)
          << err.what();
    }
  }
}

// Node names outside DNS: the store is reached at the launch node's address, and without
// one the error names what to set.
TEST(Bootstrap, SlurmStoreHostThatDoesNotResolve) {
  {
    Env e({{"SLURM_PROCID", "0"},
           {"SLURM_NTASKS", "4"},
           {"SLURM_JOB_NUM_NODES", "2"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
           {"SLURM_NODEID", "0"},
           {"SLURM_JOB_ID", "7"},
           {"SLURM_STEP_NODELIST", "loom-no-such-node[1-2]"},
           {"SLURM_LAUNCH_NODE_IPADDR", "10.77.0.1"}});
    LaunchInfo i = launch_info_from_env();
    EXPECT_EQ(i.local_size, 2);
    EXPECT_EQ(store_url_from_env(i).rfind("tcp://10.77.0.1:", 0), 0u) << store_url_from_env(i);
  }
  {
    Env e({{"SLURM_PROCID", "0"},
           {"SLURM_NTASKS", "4"},
           {"SLURM_JOB_NUM_NODES", "2"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
           {"SLURM_NODEID", "0"},
           {"SLURM_STEP_NODELIST", "loom-no-such-node[1-2]"}});
    LaunchInfo i = launch_info_from_env();
    try {
      store_url_from_env(i);
      ADD_FAILURE() << "an unresolvable store host was accepted";
    } catch (const UserError& err) {
      EXPECT_NE(std::string(err.what()).find("loom-no-such-node1"), std::string::npos);
      EXPECT_NE(err.hint().find("MASTER_ADDR"), std::string::npos) << err.hint();
    }
  }
}

TEST(Bootstrap, BadValuesAreUserErrors) {
  {
    Env e({{"LOOM_RANK", "x"}, {"LOOM_WORLD_SIZE", "2"}});
    EXPECT_THROW(launch_info_from_env(), UserError);
  }
  {
    Env e({{"LOOM_RANK", "4"}, {"LOOM_WORLD_SIZE", "2"}});
    EXPECT_THROW(launch_info_from_env(), UserError);
  }
}

}  // namespace
}  // namespace loom::comm
