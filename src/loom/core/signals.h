// Asynchronous signals (SIGINT, SIGTERM, SIGUSR1) taken by one thread that waits for them,
// never by a thread that computes.
//
// Why: oneDNN's JIT GEMM kernels use the stack pointer as a data register. A signal whose
// handler runs on a thread inside such a kernel has its frame written where rsp points —
// into a heap buffer — and glibc aborts later ("corrupted size vs. prev_size"). Measured:
// SIGINT to a 2-rank ZeRO-3 run crashed a rank in about 1 run of 8. So a process that
// computes blocks these signals in every thread (route_signals, before any thread starts:
// threads inherit the mask) and one thread takes them with sigwait and runs the action
// set for each (on_signal) — as ordinary code, not in a signal handler.
#pragma once

#include <functional>
#include <initializer_list>

namespace loom {

// Blocks `sigs` in the calling thread and in every thread it starts from now on, and starts
// the thread that takes them. Call once, before any other thread starts; later calls add
// nothing. A routed signal without an action does what it did before: its default action
// (SIGINT, SIGTERM, SIGUSR1 end the process).
void route_signals(std::initializer_list<int> sigs);

// The action for a routed signal, run on the signal thread (nullptr: the default action
// again). Where the signal is not routed (a process that never called route_signals),
// nothing: the caller keeps its own handler for that case.
void on_signal(int sig, std::function<void(int)> action);

}  // namespace loom
