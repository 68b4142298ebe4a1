// Typed errors (DESIGN decision 11).
//
// UserError  bad input from a person (config, CLI, corrupt file): one line plus a hint,
//            printed by the CLI without a stack dump, exit status 2.
// PeerError  a peer or transport failed (death, closed socket, desync, deadline): the
//            caller recovers by rebuilding the communicator. Carries the rank that
//            noticed, the peer it blames (-1 when unknown) and the operation.
// Broken invariants use LOOM_CHECK (check.h), which throws InternalError with both values.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

// Exit statuses: 1 a bug (InternalError), 2 bad input (UserError), 3 a peer failed
// (PeerError), 4 training diverged (a non-finite or spiking step the policy did not survive:
// train/divergence.h). Neither 2 nor 4 is restarted by `loom run`: it would fail the same way.
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitDiverged = 4;

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UserError : public Error {
 public:
  UserError(const std::string& what, std::string hint) : Error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

class PeerError : public Error {
 public:
  enum class Kind { kDead, kClosed, kDesync, kTimeout, kAborted, kProtocol };
  PeerError(Kind kind, const std::string& what, int peer = -1)
      : Error(what), kind_(kind), peer_(peer) {}
  Kind kind() const { return kind_; }
  int peer() const { return peer_; }

 private:
  Kind kind_;
  int peer_;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

// errno as text, for system-call failures.
std::string errno_text(int err);

}  // namespace loom
