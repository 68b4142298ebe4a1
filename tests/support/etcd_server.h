// A real etcd server for tests (Debian etcd-server 3.4), on loopback ports, its data (and
// with tls, certificates made with the openssl command) in a scratch folder; stopped and
// removed when the object goes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/error.h"
#include "loom/launch/etcd.h"

namespace loom::test {

using launch::Etcd;
using launch::EtcdTls;

inline int etcd_free_port() {
  static int next = 23790 + static_cast<int>(getpid() % 1000) * 2;
  return next += 2;
}

// Starts etcd with args (args[0] is "etcd"), its stderr to log (opened with mode "w" or
// "a"); returns its pid.
inline pid_t spawn_etcd(std::vector<std::string> args, const std::string& log, const char* mode) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log.c_str(), mode, stderr)) _exit(126);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp("etcd", argv.data());
    _exit(127);
  }
  return pid;
}

// Certificates for a TLS etcd, made with the openssl command: a CA, a server certificate
// for 127.0.0.1 and a client certificate, all signed by the CA.
inline void make_certificates(const std::string& dir) {
  const std::string script =
      "set -e; cd '" + dir +
      "'\n"
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
      "-subj /CN=loom-test-ca\n"
      "for who in server client; do\n"
      "  openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=$who\n"
      "  if [ $who = server ]; then echo subjectAltName=IP:127.0.0.1 > $who.ext;\n"
      "  else echo extendedKeyUsage=clientAuth > $who.ext; fi\n"
      "  openssl x509 -req -in $who.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile $who.ext -out $who.crt\n"
      "done\n";
  const std::string file = dir + "/make.sh";
  std::ofstream(file) << script;
  if (std::system(("bash " + file + " > " + dir + "/make.log 2>&1").c_str()) != 0)
    throw std::runtime_error("openssl could not make the test certificates: see " + dir +
                             "/make.log");
}

// A real etcd, on loopback ports, its data and certificates in a scratch folder; with tls,
// https only and client certificates required.
class EtcdServer {
 public:
  explicit EtcdServer(bool tls = false) {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom-etcd-" + std::to_string(getpid()) + (tls ? "-tls" : ""));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "certs");
    const std::string certs = (dir_ / "certs").string();
    if (tls) {
      make_certificates(certs);
      tls_ = {certs + "/ca.crt", certs + "/client.crt", certs + "/client.key"};
    }
    const int port = etcd_free_port();
    url_ = std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(port + 1);
    const std::string data = (dir_ / "data").string(), log = (dir_ / "etcd.log").string();
    std::vector<std::string> args = {"etcd",
                                     "--data-dir",
                                     data,
                                     "--listen-client-urls",
                                     url_,
                                     "--advertise-client-urls",
                                     url_,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "default=" + peer};
    if (tls)
      for (std::string a :
           {"--cert-file", "server.crt", "--key-file", "server.key", "--trusted-ca-file", "ca.crt"})
        args.push_back(a.starts_with("--") ? a : certs + "/" + a);
    if (tls) args.push_back("--client-cert-auth");
    pid_ = spawn_etcd(args, log, "w");
    Etcd probe(url_, tls_, 1);
    for (int i = 0; i < 200; ++i) {
      try {
        probe.get("probe");
        return;
      } catch (const PeerError&) {
        int status;
        if (waitpid(pid_, &status, WNOHANG) == pid_)
          throw std::runtime_error(
              "etcd exited at start (is Debian's etcd-server installed? "
              "scripts/setup.sh installs it); see " +
              log);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    throw std::runtime_error("etcd did not answer at " + url_ + " within 20 s; see " + log);
  }
  ~EtcdServer() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    std::filesystem::remove_all(dir_);
  }
  const std::string& url() const { return url_; }
  const EtcdTls& tls() const { return tls_; }

 private:
  std::filesystem::path dir_;
  std::string url_;
  EtcdTls tls_;
  pid_t pid_ = -1;
};

// A real etcd cluster of n members on loopback ports (member i: client port P_i, peer port
// P_i + 1), its data in a scratch folder. A member can be killed (SIGKILL: a crash) and
// started again on its data, as an operator would.
class EtcdCluster {
 public:
  explicit EtcdCluster(int n) {
    dir_ =
        std::filesystem::temp_directory_path() / ("loom-etcd-cluster-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::string initial;
    for (int i = 0; i < n; ++i) {
      const int port = etcd_free_port();
      urls_.push_back("http://127.0.0.1:" + std::to_string(port));
      peers_.push_back("http://127.0.0.1:" + std::to_string(port + 1));
      initial += (i ? "," : "") + name(i) + "=" + peers_.back();
    }
    initial_ = initial;
    pids_.assign(n, -1);
    for (int i = 0; i < n; ++i) start(i);
    for (int i = 0; i < n; ++i) wait_ready(i);
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < pids_.size(); ++i) kill(static_cast<int>(i));
    std::filesystem::remove_all(dir_);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  const std::string& url(int i) const { return urls_[i]; }
  std::string urls() const {  // every member, comma-separated
    std::string all;
    for (const std::string& u : urls_) all += (all.empty() ? "" : ",") + u;
    return all;
  }
  // The member that leads now (asked of every running member), or -1.
  int leader() {
    std::vector<std::string> ids(urls_.size());
    std::string leader;
    for (size_t i = 0; i < urls_.size(); ++i) {
      if (pids_[i] < 0) continue;
      try {
        const Etcd::Status s = Etcd(urls_[i], {}, 1, false).status();
        ids[i] = s.member_id;
        if (!s.leader.empty()) leader = s.leader;
      } catch (const PeerError&) {
      }
    }
    for (size_t i = 0; i < ids.size(); ++i)
      if (!leader.empty() && ids[i] == leader) return static_cast<int>(i);
    return -1;
  }
  void kill(int i) {
    if (pids_[i] < 0) return;
    ::kill(pids_[i], SIGKILL);
    waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
  }
  // Starts member i (again, on its data); returns at once.
  void start(int i) {
    const std::string data = (dir_ / name(i)).string(), log = data + ".log";
    std::filesystem::create_directories(dir_);
    std::vector<std::string> args = {"etcd",    "--name",
                                     name(i),   "--data-dir",
                                     data,      "--listen-client-urls",
                                     urls_[i],  "--advertise-client-urls",
                                     urls_[i],  "--listen-peer-urls",
                                     peers_[i], "--initial-advertise-peer-urls",
                                     peers_[i], "--initial-cluster",
                                     initial_,  "--initial-cluster-state",
                                     "new"};
    pids_[i] = spawn_etcd(args, log, "a");
  }
  // Member i serves a read (so the cluster has a leader), within 30 s.
  void wait_ready(int i) {
    Etcd probe(urls_[i], {}, 1, false);
    for (int t = 0; t < 300; ++t) {
      try {
        probe.get("probe");
        return;
      } catch (const PeerError&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    throw std::runtime_error("etcd member " + name(i) + " did not serve a read within 30 s; see " +
                             (dir_ / name(i)).string() + ".log");
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }
  std::filesystem::path dir_;
  std::vector<std::string> urls_, peers_;
  std::string initial_;
  std::vector<pid_t> pids_;
};

}  // namespace loom::test
