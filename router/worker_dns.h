// Worker discovery through DNS: the addresses of a name (a Kubernetes
// headless Service answers with one A/AAAA record per pod) turned into the
// router's worker list, looked up again at an interval so that workers
// come and go with the records.
//
// A lookup that says the name has no records (NXDOMAIN, or no address: a
// headless Service with no pods) gives an empty list; any other failure
// (no answer, a server error) keeps the last list, so that a DNS outage
// does not empty the router.
//
// Thread-safety: ResolveWorkers is thread-safe when its lookup is.
// WorkerDnsWatcher: Start and Stop from one thread; the callback runs on
// the watcher's thread, never two at once.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera::router {

// The addresses (numeric, "10.0.0.7" or "fd00::7") of a host name.
// NOT_FOUND when the name has no address; UNAVAILABLE or another code when
// the lookup failed.
using DnsLookup = std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host)>;

// getaddrinfo (TCP, IPv4 and IPv6): honours /etc/hosts, the resolver's
// search path (a pod's namespace) and nsswitch.
absl::StatusOr<std::vector<std::string>> SystemDnsLookup(const std::string& host);

struct DnsTarget {
  std::string host;
  int port = 0;
};
// "host:port" (host a name, not an address literal). INVALID_ARGUMENT
// names what is wrong.
absl::StatusOr<DnsTarget> ParseDnsTarget(const std::string& target);

// The worker addresses of `target`: "ip:port" ("[ip6]:port"), sorted and
// without duplicates; empty when the name has no address.
absl::StatusOr<std::vector<std::string>> ResolveWorkers(const DnsTarget& target,
                                                        const DnsLookup& lookup);

struct WorkerDnsOptions {
  DnsTarget target;
  absl::Duration interval = absl::Seconds(5);
};

class WorkerDnsWatcher {
 public:
  // Called with the new list whenever a lookup gives one different from
  // the last (the first successful lookup always).
  using Callback = std::function<void(const std::vector<std::string>& workers)>;

  WorkerDnsWatcher(WorkerDnsOptions options, DnsLookup lookup, Callback callback);
  ~WorkerDnsWatcher();  // Stop()
  WorkerDnsWatcher(const WorkerDnsWatcher&) = delete;
  WorkerDnsWatcher& operator=(const WorkerDnsWatcher&) = delete;

  // Looks up once on the calling thread (calling back when that succeeds),
  // then every interval on a thread of its own. Returns the first lookup's
  // error, if any; the watcher keeps trying either way.
  absl::Status Start();
  // Ends the thread; no callback runs after it returns.
  void Stop();

 private:
  absl::Status Poll();  // one lookup, and the callback on a change
  void Loop();

  const WorkerDnsOptions options_;
  const DnsLookup lookup_;
  const Callback callback_;
  bool has_last_ = false;  // only the polling thread touches these two
  std::vector<std::string> last_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::router
