#include "loom/profile/trace.h"

namespace loom {

Trace& Trace::get() {
  static Trace* t = new Trace();  // never destroyed: threads may still record at exit
  return *t;
}

void Trace::add(std::string name, const char* cat, double t0_us, double t1_us, int tid,
                std::string args) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({std::move(name), cat, t0_us, t1_us - t0_us, tid, std::move(args)});
}

void Trace::add_counter(std::string name, double t_us, std::string args) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({std::move(name), "system", t_us, 0, 0, std::move(args), 'C'});
}

std::vector<Trace::Event> Trace::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> e;
  e.swap(events_);
  return e;
}

}  // namespace loom
