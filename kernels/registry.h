// The kernel registry: for every op the model runs, an ordered list of
// candidate implementations, and the rules that pick one per device.
//
// Selection, per op: walk the candidates in priority order and take the
// first whose why_not(device) is empty; every other candidate is reported
// with the reason it was not taken. An explicit override (a backend flag
// such as --attention_backend=cpu_reference) picks that candidate or fails
// with the reasons; it never falls back silently. Automatic choice happens
// only between interchangeable implementations of the same op.
//
// The backend override flags (`--gemm_backend`, `--attention_backend`,
// `--norm_backend`, `--sampling_backend`, `--all_reduce_backend`) each
// control a family of ops; a backend named by a flag must implement every op
// of its family.
//
// Thread-safety: a Registry is immutable after its candidates are added;
// const methods are safe from any thread. BuiltinRegistry() is built once.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/op.h"

namespace tessera::kernels {

// One override flag and the op family it controls.
struct BackendFlag {
  std::string_view flag;         // e.g. "attention_backend"
  std::string_view description;  // what it controls
};

// Every backend override flag the services accept.
const std::vector<BackendFlag>& BackendFlags();

// The ops a flag controls (empty for an unknown flag).
std::vector<Op> OpsOfFlag(std::string_view flag);

// The flag that controls `op`, or empty when none does.
std::string_view FlagOfOp(Op op);

// Names a user may pass to `flag` ("auto" is always valid): the candidates
// registered in this build for every op of the flag's family, in priority order.
std::vector<std::string> KnownBackends(std::string_view flag);

// OK when `name` is "auto" or a known backend of `flag`; otherwise
// INVALID_ARGUMENT naming the flag, the bad value and the valid choices.
// Checks the name only; whether it can run on the device is decided by
// Registry::SelectAll.
absl::Status ValidateBackendOverride(std::string_view flag, std::string_view name);

// One implementation of one op.
struct Candidate {
  std::string name;  // e.g. "cpu", "cpu_reference"; unique per op
  Op op;
  // Empty when the candidate can run on `device`; otherwise why not, in
  // words an operator can act on ("needs a CUDA device; this is cpu:0 ...").
  std::function<std::optional<std::string>(const DeviceDescription&)> why_not;
  // Optional: what the candidate will do on `device` when chosen
  // (e.g. "avx512 kernels"); shown in the selection report.
  std::function<std::string(const DeviceDescription&)> details;
};

struct Rejection {
  std::string name;
  std::string reason;
};

struct Selection {
  Op op;
  std::string chosen;  // candidate name
  std::string why;     // "auto: first eligible; avx512 kernels" or "override --gemm_backend=..."
  std::vector<Rejection> rejected;  // every other candidate, in priority order
};

struct SelectionReport {
  std::string device;                 // DeviceDescription::Summary()
  std::vector<Selection> selections;  // one per op, in kAllOps order

  const Selection* Find(Op op) const;
  // A table for logs and `tessera doctor`:
  //   device: cpu:0 ...
  //   op                 chosen         why                      rejected
  //   gemm               cpu            auto: avx512 kernels     cpu_reference (lower priority than
  //   cpu)
  std::string ToTable() const;
};

// Flag name (without dashes) -> backend name; a missing flag or "auto"
// means automatic selection.
using BackendOverrides = std::map<std::string, std::string, std::less<>>;

class Registry {
 public:
  // Appends `candidate` at the lowest priority of its op. INVALID_ARGUMENT
  // for an empty name, a missing why_not, or a duplicate (op, name).
  absl::Status Add(Candidate candidate);

  // Candidates of `op`, highest priority first.
  std::vector<const Candidate*> CandidatesFor(Op op) const;

  // Chooses the implementation of `op` on `device`. `override_name` empty
  // or "auto": the first eligible candidate, or FAILED_PRECONDITION listing
  // every candidate's reason when none is. Otherwise exactly that
  // candidate, or INVALID_ARGUMENT when it is unknown for `op` or cannot
  // run on `device` (with the reason). `flag` only labels messages.
  absl::StatusOr<Selection> Select(Op op, const DeviceDescription& device,
                                   std::string_view override_name = "auto",
                                   std::string_view flag = "") const;

  // Select() for every op with the overrides of its family. Fails with
  // every problem at once (unknown flags, unknown or unusable backends).
  absl::StatusOr<SelectionReport> SelectAll(const DeviceDescription& device,
                                            const BackendOverrides& overrides = {}) const;

 private:
  std::vector<Candidate> candidates_;
};

// The registry of this build: CPU candidates (kernels/cpu_backend.h) and,
// when CUDA is built, the CUDA candidates ahead of them.
const Registry& BuiltinRegistry();

}  // namespace tessera::kernels
