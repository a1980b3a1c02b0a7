// libFuzzer target: the request path of the three services, through the
// same checks and conversions the services run on a peer's message.
//
// The first byte picks the message, the rest is its wire encoding:
//   0  tessera.v1.GenerateRequest (router): the model name, unknown sampling
//      fields, the prompt-size bound, tokenization, then the sampling
//      conversion the worker applies. A refused text must really be too
//      long for the context; an accepted conversion must fit it.
//   1  tessera.v1.WorkerGenerateRequest (worker): ToEngineRequest; an
//      accepted request has its ids in the vocabulary and its max_tokens
//      within the context.
//   2  a stream of tessera.v1.DraftControl (drafter), each prefixed by one
//      length byte, applied to a DraftSession over an n-gram source as
//      Speculate does, with a round of proposals after each; a proposal is
//      for an open sequence and within its draft limit.
//   3  a bare text prompt through the router's text path (as in 0), where
//      request.dict's long tokens reach the size bound.
// Any violated promise aborts (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "services/common/sampling_convert.h"
#include "services/drafter/drafter_service.h"
#include "services/router/request_checks.h"
#include "services/worker/worker_request.h"
#include "tessera/v1/drafter.pb.h"
#include "tessera/v1/inference.pb.h"
#include "tessera/v1/worker.pb.h"
#include "worker/spec/draft_source.h"
#include "text/tokenizer/tokenizer.h"

namespace {

using namespace tessera;

constexpr int kVocab = 4096;  // the trained pair's vocabulary
constexpr int kContext = 64;  // small, so that inputs reach the bound
constexpr int kMaxDraft = 16;

const Tokenizer& TheTokenizer() {
  static const Tokenizer* t = [] {
    auto loaded = Tokenizer::FromDirectory(TESSERA_FUZZ_TOKENIZER_DIR);
    if (!loaded.ok()) std::abort();
    return loaded->release();
  }();
  return *t;
}

// The router's text-prompt path: the size bound, then tokenization. A
// refusal must be right: the text encodes to more than the context.
absl::StatusOr<std::vector<int32_t>> TextPrompt(const std::string& text, bool add_special) {
  const Tokenizer& t = TheTokenizer();
  EncodeOptions eo;
  eo.add_special_tokens = add_special;
  absl::StatusOr<std::vector<int32_t>> ids = t.Encode(text, eo);
  const absl::Status fits = services::CheckPromptBytes(text.size(), 0, kContext, &t);
  if (!fits.ok() && ids.ok() && ids->size() <= static_cast<size_t>(kContext)) std::abort();
  if (!fits.ok()) return fits;
  return ids;
}

void FuzzGenerate(const v1::GenerateRequest& req) {
  if (!services::CheckModelName(req.model(), "default").ok()) return;
  if (!services::CheckKnownSamplingFields(req.sampling()).ok()) return;
  std::vector<int32_t> prompt(req.token_ids().ids().begin(), req.token_ids().ids().end());
  if (req.prompt_case() == v1::GenerateRequest::kText) {
    absl::StatusOr<std::vector<int32_t>> ids = TextPrompt(req.text(), !req.no_bos());
    if (!ids.ok()) return;
    prompt = std::move(*ids);
  }
  auto converted = services::ConvertSampling(req.sampling(), kVocab,
                                             kContext - static_cast<int>(prompt.size()), 1);
  if (!converted.ok()) return;
  if (converted->max_tokens < 1 ||
      converted->max_tokens > kContext - static_cast<int>(prompt.size())) {
    std::abort();
  }
}

void FuzzWorkerGenerate(const v1::WorkerGenerateRequest& req) {
  auto r = services::ToEngineRequest(req, kVocab, kContext, 1);
  if (!r.ok()) return;
  for (int32_t id : r->prompt) {
    if (id < 0 || id >= kVocab) std::abort();
  }
  for (int32_t id : r->generated) {
    if (id < 0 || id >= kVocab) std::abort();
  }
  if (r->prompt.empty() || r->max_tokens < 1 ||
      r->max_tokens > kContext - static_cast<int>(r->prompt.size()) ||
      static_cast<int>(r->generated.size()) >= r->max_tokens) {
    std::abort();
  }
}

void FuzzDraftControls(const uint8_t* data, size_t size) {
  std::unique_ptr<spec::DraftSource> source = spec::MakeNgramSource({});
  spec::DraftSession session(source.get(), kMaxDraft);
  std::set<spec::SeqKey> open;
  size_t at = 0;
  while (at < size) {
    const size_t n = std::min<size_t>(data[at], size - at - 1);
    v1::DraftControl control;
    const bool parsed = control.ParseFromArray(data + at + 1, static_cast<int>(n));
    at += 1 + n;
    if (!parsed) continue;
    services::ApplyControl(control, &session);
    if (control.has_open()) open.insert(control.open().seq());
    if (control.has_close()) open.erase(control.close().seq());
    std::vector<std::pair<spec::SeqKey, spec::Draft>> sent = session.TakeProposals();
    for (const auto& [seq, d] : sent) {
      if (!open.count(seq) || d.tokens.empty() || d.tokens.size() > kMaxDraft) std::abort();
    }
    session.RunAhead(sent);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t* body = data + 1;
  const int n = static_cast<int>(size - 1);
  switch (data[0] % 4) {
    case 0: {
      v1::GenerateRequest req;
      if (req.ParseFromArray(body, n)) FuzzGenerate(req);
      break;
    }
    case 1: {
      v1::WorkerGenerateRequest req;
      if (req.ParseFromArray(body, n)) FuzzWorkerGenerate(req);
      break;
    }
    case 2:
      FuzzDraftControls(body, size - 1);
      break;
    default:  // a bare text prompt, for the dictionary's words to reach
      (void)TextPrompt(std::string(reinterpret_cast<const char*>(body), size - 1), true);
      break;
  }
  return 0;
}
