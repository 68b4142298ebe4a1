/* OpenMPI peer for bench/comm_vs_peers.sh: MPI_Allreduce, MPI_Allgather and
 * MPI_Reduce_scatter_block on f32, median over iterations of the slowest rank's time,
 * one JSON object per (op, size) on rank 0's stdout, in loom bench's field names.
 *   mpirun -np N mpi_bench MIN_BYTES MAX_BYTES FACTOR ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t lo = argc > 1 ? strtoull(argv[1], 0, 10) : 4096;
  size_t hi = argc > 2 ? strtoull(argv[2], 0, 10) : (64 << 20);
  size_t factor = argc > 3 ? strtoull(argv[3], 0, 10) : 4;
  int iters = argc > 4 ? atoi(argv[4]) : 20;
  const char* only = argc > 5 ? argv[5] : NULL; /* one op, e.g. allgather; all three when absent */
  const char* ops[] = {"allreduce", "allgather", "reduce_scatter"};
  double* times = malloc(sizeof(double) * iters);
  for (int o = 0; o < 3; ++o) {
    if (only && strcmp(only, ops[o]) != 0) continue;
    for (size_t bytes = lo; bytes <= hi; bytes *= factor) {
      size_t count = bytes / 4, per = count / n;
      if (o > 0 && per == 0) continue;
      float* a = malloc((count ? count : 1) * 4);
      float* b = malloc((count ? count : 1) * 4);
      /* Real data in both, as loom bench has: untouched calloc memory maps the kernel's one
       * zero page, which every read then finds in cache (and a cross-memory attach pins one
       * page), so the peer's sources never came from memory (found 2026-12-07: 64 MiB
       * allgather 6.7-7.7 ms on 2 ranks, less than a 32 MiB memcpy plus a 32 MiB
       * process_vm_readv take on this machine). */
      for (size_t i = 0; i < count; ++i) a[i] = (float)(rank + 1) + (float)(i % 7) * 0.25f;
      memset(b, 0x3f, (count ? count : 1) * 4);
      for (int it = -5; it < iters; ++it) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (o == 0) MPI_Allreduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (o == 1) MPI_Allgather(a, (int)per, MPI_FLOAT, b, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
        if (o == 2) MPI_Reduce_scatter_block(a, b, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) * 1e6;
        if (it >= 0) times[it] = t;
      }
      MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      qsort(times, iters, sizeof(double), cmp);
      double med = times[iters / 2];
      size_t size = o == 0 ? count * 4 : per * n * 4;
      double factor_bus = o == 0 ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
      double algbw = size / med / 1e3;
      if (rank == 0)
        printf(
            "{\"peer\":\"openmpi\",\"op\":\"%s\",\"bytes\":%zu,\"nranks\":%d,\"time_us\":%.3f,"
            "\"algbw\":%.4f,\"busbw\":%.4f}\n",
            ops[o], size, n, med, algbw, algbw * factor_bus);
      fflush(stdout);
      free(a);
      free(b);
    }
  }
  free(times);
  MPI_Finalize();
  return 0;
}
