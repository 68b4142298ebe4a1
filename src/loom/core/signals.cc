#include "loom/core/signals.h"

#include <pthread.h>
#include <signal.h>

#include <array>
#include <mutex>
#include <thread>

namespace loom {
namespace {

struct Router {
  std::mutex mu;
  sigset_t routed;
  bool started = false;
  std::array<std::function<void(int)>, NSIG> actions;
};

Router& router() {
  static Router* r = new Router;  // never destroyed: the signal thread outlives main()
  return *r;
}

// The signal thread: takes each routed signal and runs its action; one without an action
// gets the default action (the process ends as if the signal had never been routed).
void take_signals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    std::function<void(int)> action;
    {
      std::lock_guard<std::mutex> lock(router().mu);
      action = router().actions[sig];
    }
    if (action) {
      action(sig);
      continue;
    }
    ::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    ::raise(sig);
  }
}

}  // namespace

void route_signals(std::initializer_list<int> sigs) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.started) return;
  sigemptyset(&r.routed);
  for (int s : sigs) sigaddset(&r.routed, s);
  pthread_sigmask(SIG_BLOCK, &r.routed, nullptr);
  std::thread(take_signals, r.routed).detach();
  r.started = true;
}

void on_signal(int sig, std::function<void(int)> action) {
  if (sig <= 0 || sig >= NSIG) return;
  std::lock_guard<std::mutex> lock(router().mu);
  router().actions[sig] = std::move(action);
}

}  // namespace loom
