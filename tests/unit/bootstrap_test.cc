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
         {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  LaunchInfo i = launch_info_from_env();
  EXPECT_EQ(i.source, "slurm");
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.size, 8);
  EXPECT_EQ(i.local_size, 4);
  EXPECT_EQ(i.job_id, "991");
  EXPECT_EQ(store_url_from_env(i).rfind("tcp://gpu07:", 0), 0u);
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("n[1,3-5]"), "n1");
  EXPECT_EQ(first_slurm_host("solo"), "solo");
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
