// Subnormal floats flushed to zero (core/float_env.h) as loom's main sets it: once, on the
// main thread before any other starts, from LOOM_FLUSH_DENORMALS. Run by CTest twice: with
// the variable unset (every OpenMP worker and every other thread must flush) and with it 0
// (none may). This test's main stands in for apps/loom's.
#include "loom/core/float_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "loom/kernels/cpu/gemm.h"

namespace loom {
namespace {

bool expected() {
  const char* v = std::getenv("LOOM_FLUSH_DENORMALS");
  return !(v && std::strcmp(v, "0") == 0);
}

// A subnormal input read as zero (DAZ), and a product whose exact result is subnormal
// written as zero (FTZ); through volatiles, so the compiler computes nothing ahead.
bool computes_as_flushed() {
  volatile float sub = 1e-39f, tiny = 1e-20f, one = 1.0f;
  const float in = sub * one, out = tiny * tiny;
  return in == 0.0f && out == 0.0f;
}

TEST(FloatEnv, EveryOpenMpWorkerHasTheMainThreadsSetting) {
  int team = 0;
  const int flushing = kernels::cpu::threads_flushing_denormals(&team);
  EXPECT_GE(team, 2) << "run with 2 or more OpenMP threads";
  EXPECT_EQ(flushing, expected() ? team : 0) << "of " << team << " threads";
}

TEST(FloatEnv, OtherThreadsInheritIt) {
  bool flushing = !expected(), flushed = !expected();
  std::thread([&] { flushing = flushing_denormals(), flushed = computes_as_flushed(); }).join();
  EXPECT_EQ(flushing, expected());
  EXPECT_EQ(flushed, expected());
}

TEST(FloatEnv, SubnormalsComputeAsZeroOnlyWhenFlushed) {
  EXPECT_EQ(flushing_denormals(), expected());
  EXPECT_EQ(computes_as_flushed(), expected());
  // Normal floats are untouched either way: the smallest normal survives a product by 1.
  volatile float smallest = 1.17549435e-38f, one = 1.0f;
  EXPECT_EQ(smallest * one, 1.17549435e-38f);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  loom::flush_denormals_from_env();  // before any thread, as apps/loom's main
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
