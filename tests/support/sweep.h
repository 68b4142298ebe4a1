// The collective sweep shared by the thread-rank and process-rank tests: every collective
// x algorithm valid here x dtype x reduce op x count, in place and out of place, against
// closed-form values.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "support/values.h"

namespace loom::test {

using comm::Algo;
using comm::Communicator;
using comm::OpKind;
using comm::OpOptions;
using comm::ReduceOp;

inline const DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                                  DType::kI32, DType::kI64,  DType::kU8};
inline const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                   ReduceOp::kProd};

inline std::vector<Algo> algos_to_test(const Communicator& c, OpKind op) {
  std::vector<Algo> v = comm::valid_algos(op, c.topology());
  v.push_back(Algo::kAuto);
  return v;
}

struct Checker {
  int rank;
  std::string where;
  const std::function<void(const std::string&)>& report;
  int failures = 0;
  void expect(double got, double want, size_t i, const std::string& what) {
    if (got == want) return;
    if (failures++ < 3)
      report(where + " " + what + " rank " + std::to_string(rank) + " element " +
             std::to_string(i) + ": got " + std::to_string(got) + " want " + std::to_string(want));
  }
};

inline std::string label(const char* op, Algo a, DType t, size_t count, bool in_place,
                         ReduceOp r = ReduceOp::kSum) {
  return std::string(op) + "/" + comm::algo_name(a) + "/" + dtype_name(t) + "/" +
         comm::reduce_op_name(r) + "/count=" + std::to_string(count) +
         (in_place ? "/in-place" : "/out-of-place");
}

// Runs the sweep; returns the number of wrong results (each also passed to `report`).
inline int sweep(Communicator& c, const std::vector<size_t>& counts, const std::string& where,
                 const std::function<void(const std::string&)>& report) {
  const int n = c.size(), r = c.rank();
  Checker ck{r, where, report};
  for (DType t : kAllTypes) {
    const size_t es = dtype_size(t);
    for (size_t count : counts) {
      for (bool in_place : {false, true}) {
        // allreduce
        for (ReduceOp op : kAllOps) {
          for (Algo a : algos_to_test(c, OpKind::kAllreduce)) {
            std::vector<uint8_t> in(count * es + 1), out(count * es + 1, 0xEE);
            fill(t, in.data(), count, op, r);
            void* dst = in_place ? in.data() : out.data();
            c.allreduce(in.data(), dst, count, t, op, OpOptions{a});
            std::string what = label("allreduce", a, t, count, in_place, op);
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, dst, i), as_dtype(t, expected_value(op, t, n, i)), i, what);
          }
          // reduce_scatter: each rank gets block r of the reduction of n*count inputs.
          for (Algo a : algos_to_test(c, OpKind::kReduceScatter)) {
            std::vector<uint8_t> in(n * count * es + 1), out(count * es + 1, 0xEE);
            fill(t, in.data(), n * count, op, r);
            void* dst = in_place ? in.data() + r * count * es : out.data();
            c.reduce_scatter(in.data(), dst, count, t, op, OpOptions{a});
            std::string what = label("reduce_scatter", a, t, count, in_place, op);
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, dst, i), as_dtype(t, expected_value(op, t, n, r * count + i)), i,
                        what);
          }
          // reduce to a root that moves with the count
          for (Algo a : algos_to_test(c, OpKind::kReduce)) {
            int root = static_cast<int>(count % n);
            std::vector<uint8_t> in(count * es + 1), out(count * es + 1, 0xEE);
            fill(t, in.data(), count, op, r);
            void* dst = in_place ? in.data() : out.data();
            c.reduce(in.data(), dst, count, t, op, root, OpOptions{a});
            std::string what = label("reduce", a, t, count, in_place, op);
            if (r == root)
              for (size_t i = 0; i < count; ++i)
                ck.expect(load(t, dst, i), as_dtype(t, expected_value(op, t, n, i)), i, what);
          }
        }
        // allgather: block q = rank q's values
        for (Algo a : algos_to_test(c, OpKind::kAllgather)) {
          std::vector<uint8_t> in(count * es + 1), out(n * count * es + 1, 0xEE);
          void* src = in_place ? out.data() + r * count * es : in.data();
          fill(t, src, count, ReduceOp::kSum, r);
          c.allgather(src, out.data(), count, t, OpOptions{a});
          std::string what = label("allgather", a, t, count, in_place);
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, out.data(), q * count + i),
                        as_dtype(t, input_value(ReduceOp::kSum, q, i)), q * count + i, what);
        }
        // broadcast from each root in turn
        for (Algo a : algos_to_test(c, OpKind::kBroadcast)) {
          for (int root = 0; root < n; root += std::max(1, n / 3)) {
            std::vector<uint8_t> buf(count * es + 1, 0xEE);
            if (r == root) fill(t, buf.data(), count, ReduceOp::kSum, root);
            c.broadcast(buf.data(), count, t, root, OpOptions{a});
            std::string what =
                label("broadcast", a, t, count, false) + "/root=" + std::to_string(root);
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, buf.data(), i), as_dtype(t, input_value(ReduceOp::kSum, root, i)),
                        i, what);
          }
        }
        if (in_place) continue;
        // gather / scatter / alltoall (direct only)
        {
          int root = n - 1;
          std::vector<uint8_t> in(count * es + 1), out(n * count * es + 1, 0xEE);
          fill(t, in.data(), count, ReduceOp::kSum, r);
          c.gather(in.data(), out.data(), count, t, root);
          if (r == root)
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < count; ++i)
                ck.expect(load(t, out.data(), q * count + i),
                          as_dtype(t, input_value(ReduceOp::kSum, q, i)), i, "gather");
          std::vector<uint8_t> sin(n * count * es + 1), sout(count * es + 1, 0xEE);
          if (r == 0) fill(t, sin.data(), n * count, ReduceOp::kSum, 7);
          c.scatter(sin.data(), sout.data(), count, t, 0);
          for (size_t i = 0; i < count; ++i)
            ck.expect(load(t, sout.data(), i),
                      as_dtype(t, input_value(ReduceOp::kSum, 7, r * count + i)), i, "scatter");
          // alltoall: rank q sends block p = values(q, p*count + i) to rank p.
          std::vector<uint8_t> ain(n * count * es + 1), aout(n * count * es + 1, 0xEE);
          fill(t, ain.data(), n * count, ReduceOp::kSum, r);
          c.alltoall(ain.data(), aout.data(), count, t);
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              ck.expect(load(t, aout.data(), q * count + i),
                        as_dtype(t, input_value(ReduceOp::kSum, q, r * count + i)), i, "alltoall");
        }
      }
    }
  }
  c.barrier();
  return ck.failures;
}

}  // namespace loom::test
