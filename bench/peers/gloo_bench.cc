// Gloo peer for bench/comm_vs_peers.sh: Gloo's ring allreduce and ring allgather over its
// TCP transport (on loopback, or GLOO_HOST: this rank's address on the emulated machines of
// bench/cluster_vs_peers.sh), f32; median over iterations of the slowest rank's time; JSON
// lines on rank 0's stdout in loom bench's field names.
//   RANK=r SIZE=n STORE_DIR=dir [GLOO_HOST=addr] gloo_bench MIN MAX FACTOR ITERS
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  int rank = std::atoi(std::getenv("RANK")), n = std::atoi(std::getenv("SIZE"));
  size_t lo = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096;
  size_t hi = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (64 << 20);
  size_t factor = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 4;
  int iters = argc > 4 ? std::atoi(argv[4]) : 20;
  gloo::transport::tcp::attr attr;
  const char* host = std::getenv("GLOO_HOST");
  attr.hostname = host && *host ? host : "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fs(std::getenv("STORE_DIR"));
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->connectFullMesh(fs, dev);
  const char* names[] = {"allreduce", "allgather"};
  for (int o = 0; o < 2; ++o) {
    for (size_t bytes = lo; bytes <= hi; bytes *= factor) {
      size_t count = bytes / 4, per = count / n;
      if (o == 1 && per == 0) continue;
      std::vector<float> a(std::max<size_t>(count, 1)), b(std::max<size_t>(count, 1));
      // Values, not zeros (as mpi_bench.c, whose untouched inputs read the kernel's zero page).
      for (size_t i = 0; i < a.size(); ++i) a[i] = float(rank + 1) + float(i % 7) * 0.25f;
      std::vector<double> times(iters);
      std::vector<float*> ptrs{a.data()};
      std::vector<const float*> in{a.data()};
      std::unique_ptr<gloo::Algorithm> alg;
      if (o == 0)
        alg.reset(new gloo::AllreduceRing<float>(ctx, ptrs, static_cast<int>(count)));
      else
        alg.reset(new gloo::AllgatherRing<float>(ctx, in, b.data(), static_cast<int>(per)));
      gloo::BarrierAllToOne barrier(ctx);
      for (int it = -5; it < iters; ++it) {
        barrier.run();
        auto t0 = std::chrono::steady_clock::now();
        alg->run();
        double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                       .count();
        if (it >= 0) times[it] = t;
      }
      // The slowest rank's time per iteration.
      std::vector<float*> tp;
      std::vector<float> tf(times.begin(), times.end());
      tp.push_back(tf.data());
      gloo::AllreduceRing<float> mx(ctx, tp, iters, gloo::ReductionFunction<float>::max);
      mx.run();
      std::sort(tf.begin(), tf.end());
      double med = tf[iters / 2];
      size_t size = o == 0 ? count * 4 : per * n * 4;
      double bus = o == 0 ? 2.0 * (n - 1) / n : double(n - 1) / n;
      double algbw = size / med / 1e3;
      if (rank == 0)
        std::printf(
            "{\"peer\":\"gloo\",\"op\":\"%s\",\"bytes\":%zu,\"nranks\":%d,\"time_us\":%.3f,"
            "\"algbw\":%.4f,\"busbw\":%.4f}\n",
            names[o], size, n, med, algbw, algbw * bus);
      std::fflush(stdout);
    }
  }
  return 0;
}
