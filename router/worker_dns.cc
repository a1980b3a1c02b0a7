#include "router/worker_dns.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace tessera::router {

absl::StatusOr<std::vector<std::string>> SystemDnsLookup(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc == EAI_NONAME || rc == EAI_NODATA) {
    return absl::NotFoundError(absl::StrCat(host, ": no address (", gai_strerror(rc), ")"));
  }
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(host, ": lookup failed: ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* addr = nullptr;
    if (p->ai_family == AF_INET) {
      addr = &reinterpret_cast<const sockaddr_in*>(p->ai_addr)->sin_addr;
    } else if (p->ai_family == AF_INET6) {
      addr = &reinterpret_cast<const sockaddr_in6*>(p->ai_addr)->sin6_addr;
    } else {
      continue;
    }
    if (inet_ntop(p->ai_family, addr, buf, sizeof(buf)) != nullptr) out.emplace_back(buf);
  }
  freeaddrinfo(res);
  return out;
}

absl::StatusOr<DnsTarget> ParseDnsTarget(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker DNS target '", target, "': expected host:port"));
  }
  DnsTarget t;
  t.host = target.substr(0, colon);
  if (!absl::SimpleAtoi(target.substr(colon + 1), &t.port) || t.port < 1 || t.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker DNS target '", target, "': the port must be in 1..65535"));
  }
  if (t.host.find_first_of(":[]/ ") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker DNS target '", target, "': the host must be a DNS name"));
  }
  return t;
}

absl::StatusOr<std::vector<std::string>> ResolveWorkers(const DnsTarget& target,
                                                        const DnsLookup& lookup) {
  auto addresses = lookup(target.host);
  if (absl::IsNotFound(addresses.status())) return std::vector<std::string>{};
  if (!addresses.ok()) return addresses.status();
  std::vector<std::string> out;
  out.reserve(addresses->size());
  for (const std::string& a : *addresses) {
    const bool v6 = a.find(':') != std::string::npos;
    out.push_back(v6 ? absl::StrCat("[", a, "]:", target.port) : absl::StrCat(a, ":", target.port));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

WorkerDnsWatcher::WorkerDnsWatcher(WorkerDnsOptions options, DnsLookup lookup, Callback callback)
    : options_(std::move(options)), lookup_(std::move(lookup)), callback_(std::move(callback)) {}

WorkerDnsWatcher::~WorkerDnsWatcher() { Stop(); }

absl::Status WorkerDnsWatcher::Start() {
  absl::Status first = Poll();
  thread_ = std::thread([this] { Loop(); });
  return first;
}

void WorkerDnsWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status WorkerDnsWatcher::Poll() {
  auto workers = ResolveWorkers(options_.target, lookup_);
  if (!workers.ok()) return workers.status();
  if (has_last_ && *workers == last_) return absl::OkStatus();
  has_last_ = true;
  last_ = *workers;
  callback_(last_);
  return absl::OkStatus();
}

void WorkerDnsWatcher::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.interval);
      if (stopping_) return;
    }
    if (absl::Status s = Poll(); !s.ok()) {
      LogWarning("worker DNS lookup failed; keeping the last workers",
                 {{"target", absl::StrCat(options_.target.host, ":", options_.target.port)},
                  {"error", std::string(s.message())}});
    }
  }
}

}  // namespace tessera::router
