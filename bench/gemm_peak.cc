// GEMM throughput on the model's shapes: OpenBLAS cblas_sgemm vs oneDNN (sgemm, matmul
// fp32, matmul bf16 in / fp32 out), 2 threads by default (OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS). Why loom's kernels use oneDNN (docs/architecture.md).
//   g++ -O2 -std=c++20 bench/gemm_peak.cc -o gemm_peak -lopenblas -ldnnl && ./gemm_peak
// Prints GFLOP/s, best of 7 after a warm-up, for out (M,N) = in (M,K) @ W(N,K)^T.
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <dnnl.hpp>
#include <vector>

using dnnl::memory;

namespace {
template <typename F>
double gflops(double flops, F f) {
  f();
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return flops / best / 1e9;
}
}  // namespace

int main() {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const int64_t shapes[][3] = {{1024, 1152, 384},  {1024, 1536, 384},  {1024, 384, 1536},
                               {1024, 50304, 384}, {1024, 2304, 768},  {1024, 3072, 768},
                               {1024, 768, 3072},  {1024, 50304, 768}, {1024, 1024, 1024}};
  std::printf(
      "| M | N | K | OpenBLAS sgemm | oneDNN sgemm | oneDNN matmul f32 | oneDNN matmul bf16 |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    std::vector<float> a(M * K, 0.5f), w(N * K, 0.25f), c(M * N);
    std::vector<uint16_t> a16(a.size(), 0x3f00), w16(w.size(), 0x3e80);
    const double fl = 2.0 * M * N * K;
    double ob = gflops(fl, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, a.data(), K, w.data(), K, 0,
                  c.data(), N);
    });
    double ds = gflops(
        fl, [&] { dnnl_sgemm('N', 'T', M, N, K, 1, a.data(), K, w.data(), K, 0, c.data(), N); });
    auto matmul = [&](memory::data_type dt, void* ap, void* wp) {
      memory::desc ad({M, K}, dt, {K, 1}), wd({K, N}, dt, {1, K}),
          cd({M, N}, memory::data_type::f32, {N, 1});
      dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, wd, cd), eng));
      memory am(ad, eng, ap), wm(wd, eng, wp), cm(cd, eng, c.data());
      return gflops(fl, [&] {
        prim.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, cm}});
        strm.wait();
      });
    };
    double mf = matmul(memory::data_type::f32, a.data(), w.data());
    double mb = matmul(memory::data_type::bf16, a16.data(), w16.data());
    std::printf("| %lld | %lld | %lld | %.0f | %.0f | %.0f | %.0f |\n", static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), ob, ds, mf, mb);
  }
}
