// A real etcd for the discovery tests: one or three members of Debian's /usr/bin/etcd on
// 127.0.0.1, ports chosen by the OS, data under a mkdtemp directory removed afterwards; members
// are started, SIGKILLed, restarted on the same data dir and ports, and waited for (their /health)
// through the test's loop with deadlines. Blocking curl is used only here, for test set-up.
#pragma once

#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace uvbus::test {

// A port the OS considers free now (bound to 127.0.0.1:0, then closed; every port of a cluster
// is held open until all are chosen, so they differ).
inline std::vector<int> free_ports(size_t n) {
  std::vector<int> fds;
  std::vector<int> ports;
  for (size_t i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ports.push_back(0);
    } else {
      ports.push_back(ntohs(a.sin_port));
    }
    fds.push_back(fd);
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  return ports;
}

// TLS for an etcd_cluster's client port: etcd's certificate and key, the CA it trusts for client
// certificates (which it then requires), and the client pair the fixture's own requests use.
struct etcd_tls_files {
  std::string ca;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
};

// One blocking HTTP request (test set-up only): the body, or "" on any failure.
// token: etcd's auth token, sent as the Authorization header.
inline std::string http_post(const std::string& url, const std::string& body, long* status,
                             const etcd_tls_files* tls = nullptr, const std::string& token = "") {
  std::string out;
  CURL* e = curl_easy_init();
  if (e == nullptr) return out;
  curl_slist* h = curl_slist_append(nullptr, "Content-Type: application/json");
  if (!token.empty()) h = curl_slist_append(h, ("Authorization: " + token).c_str());
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  if (!body.empty()) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 1000L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  if (tls != nullptr) {
    curl_easy_setopt(e, CURLOPT_CAINFO, tls->ca.c_str());
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);  // set-up only: a test's etcd may use a
                                                      // certificate for another host on purpose
    curl_easy_setopt(e, CURLOPT_SSLCERT, tls->client_cert.c_str());
    curl_easy_setopt(e, CURLOPT_SSLKEY, tls->client_key.c_str());
  }
  curl_easy_setopt(
      e, CURLOPT_WRITEFUNCTION, +[](char* d, size_t s, size_t n, void* u) {
        static_cast<std::string*>(u)->append(d, s * n);
        return s * n;
      });
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &out);
  long code = 0;
  if (curl_easy_perform(e) == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  if (status != nullptr) *status = code;
  curl_slist_free_all(h);
  curl_easy_cleanup(e);
  return out;
}

class etcd_cluster {
 public:
  struct member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  // tls: the members serve their client port over TLS and require client certificates.
  explicit etcd_cluster(size_t n, const etcd_tls_files* tls = nullptr)
      : tls_(tls != nullptr ? *tls : etcd_tls_files{}), has_tls_(tls != nullptr) {
    char tmpl[] = "/tmp/uvbus-etcd-XXXXXX";
    const char* d = mkdtemp(tmpl);
    dir_ = d != nullptr ? d : "";
    const std::vector<int> ports = free_ports(2 * n);
    for (size_t i = 0; i < n; ++i) {
      member m;
      m.name = "m" + std::to_string(i);
      m.client_port = ports[2 * i];
      m.peer_port = ports[2 * i + 1];
      members_.push_back(m);
    }
  }
  ~etcd_cluster() {
    for (size_t i = 0; i < members_.size(); ++i) kill_member(i);
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  etcd_cluster(const etcd_cluster&) = delete;
  etcd_cluster& operator=(const etcd_cluster&) = delete;

  [[nodiscard]] bool ok() const {
    if (dir_.empty()) return false;
    for (const member& m : members_) {
      if (m.client_port == 0 || m.peer_port == 0) return false;
    }
    return true;
  }
  [[nodiscard]] size_t size() const { return members_.size(); }
  [[nodiscard]] std::string endpoint(size_t i) const {
    return (has_tls_ ? "https" : "http") + std::string("://127.0.0.1:") +
           std::to_string(members_[i].client_port);
  }
  [[nodiscard]] std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  [[nodiscard]] bool running(size_t i) const { return members_[i].pid > 0; }
  [[nodiscard]] pid_t pid(size_t i) const { return members_[i].pid; }

  // Starts member i (again: same data dir and ports). false if fork failed.
  bool start_member(size_t i) {
    if (members_[i].pid > 0) return true;
    std::string cluster;
    for (const member& m : members_) {
      if (!cluster.empty()) cluster += ",";
      cluster += m.name + "=http://127.0.0.1:" + std::to_string(m.peer_port);
    }
    const member& m = members_[i];
    const std::string client = endpoint(i);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> args = {"/usr/bin/etcd",
                                     "--name=" + m.name,
                                     "--data-dir=" + dir_ + "/" + m.name,
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=" + cluster,
                                     "--initial-cluster-token=uvbus-test",
                                     "--initial-cluster-state=new",
                                     "--log-level=error"};
    if (has_tls_) {
      args.push_back("--cert-file=" + tls_.server_cert);
      args.push_back("--key-file=" + tls_.server_key);
      args.push_back("--trusted-ca-file=" + tls_.ca);
      args.push_back("--client-cert-auth");
    }
    const std::string log = dir_ + "/" + m.name + ".log";
    const pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    members_[i].pid = pid;
    return true;
  }
  bool start() {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!start_member(i)) return false;
    }
    return true;
  }
  // SIGKILL and reap member i.
  void kill_member(size_t i) {
    if (members_[i].pid <= 0) return;
    ::kill(members_[i].pid, SIGKILL);
    int st = 0;
    waitpid(members_[i].pid, &st, 0);
    members_[i].pid = -1;
  }

  [[nodiscard]] bool healthy(size_t i) const {
    if (members_[i].pid <= 0) return false;
    const std::string b = http_post(endpoint(i) + "/health", "", nullptr, tls());
    return b.find("\"health\":\"true\"") != std::string::npos;
  }
  // Runs the loop until every running member is healthy (checked every 50 ms) or the deadline.
  bool wait_healthy(uv_loop_t* loop, std::chrono::milliseconds deadline) {
    auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    return run_until(
        loop,
        [&] {
          const auto now = std::chrono::steady_clock::now();
          if (now - last < std::chrono::milliseconds(50)) return false;
          last = now;
          for (size_t i = 0; i < members_.size(); ++i) {
            if (running(i) && !healthy(i)) return false;
          }
          return true;
        },
        deadline);
  }
  // The member that leads now, or size() if none answers.
  [[nodiscard]] size_t leader() const {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!running(i)) continue;
      const std::string b = http_post(endpoint(i) + "/v3/maintenance/status", "{}", nullptr, tls());
      const auto id_at = b.find("\"member_id\":\"");
      const auto lead_at = b.find("\"leader\":\"");
      if (id_at == std::string::npos || lead_at == std::string::npos) continue;
      const std::string id = b.substr(id_at + 13, b.find('"', id_at + 13) - id_at - 13);
      const std::string lead = b.substr(lead_at + 10, b.find('"', lead_at + 10) - lead_at - 10);
      if (id == lead) return i;
    }
    return members_.size();
  }
  [[nodiscard]] const std::string& dir() const { return dir_; }
  [[nodiscard]] const etcd_tls_files* tls() const { return has_tls_ ? &tls_ : nullptr; }

 private:
  etcd_tls_files tls_;
  bool has_tls_ = false;
  std::string dir_;
  std::vector<member> members_;
};

}  // namespace uvbus::test
