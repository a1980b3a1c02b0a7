// TokenizePool: a few threads of their own that tokenize long prompts, so
// that a large text never occupies the gRPC threads serving other requests.
// A bounded queue: TrySubmit refuses work beyond `max_queued` tasks waiting.
//
// Thread-safety: TrySubmit from any thread. The destructor runs the tasks
// already queued, then joins the threads.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera::services {

class TokenizePool {
 public:
  // REQUIRES: threads >= 1, max_queued >= 1.
  TokenizePool(int threads, int max_queued);
  ~TokenizePool();
  TokenizePool(const TokenizePool&) = delete;
  TokenizePool& operator=(const TokenizePool&) = delete;

  // Queues `task`; false (and `task` dropped) when max_queued tasks wait.
  bool TrySubmit(std::function<void()> task);

 private:
  void Work();

  const int max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera::services
