// `tessera generate`: runs a model in-process on this machine's CPU and
// streams the completion of a prompt to stdout, then prints timing (time to
// first token, decode tokens/s) to stderr, and as JSON with --stats_json.
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "nlohmann/json.hpp"
#include "services/cli/commands.h"
#include "tessera/v1/inference.grpc.pb.h"
#include "text/tokenizer/incremental_detokenizer.h"
#include "text/tokenizer/tokenizer.h"
#include "worker/engine/local_engine.h"

ABSL_DECLARE_FLAG(std::string, device);        // doctor.cc
ABSL_DECLARE_FLAG(int, tensor_parallel_size);  // doctor.cc
ABSL_FLAG(std::string, model, "", "generate: model directory (config.json, *.safetensors)");
ABSL_FLAG(std::string, tokenizer, "", "generate: tokenizer directory; default: --model");
ABSL_FLAG(std::string, prompt, "", "generate: the prompt text");
ABSL_FLAG(std::vector<std::string>, prompt_ids, {},
          "generate: the prompt as token ids (comma-separated) instead of text; without a "
          "tokenizer the output is printed as ids");
ABSL_FLAG(int, max_tokens, 128, "generate: tokens to generate at most");
ABSL_FLAG(float, temperature, 0.0f, "generate: sampling temperature (0 = greedy)");
ABSL_FLAG(float, top_p, 1.0f, "generate: nucleus sampling mass, (0, 1]");
ABSL_FLAG(int, top_k, 0, "generate: keep the k most likely tokens (0 = off)");
ABSL_FLAG(float, min_p, 0.0f, "generate: drop tokens below min_p x the top probability");
ABSL_FLAG(float, repetition_penalty, 1.0f, "generate: penalty on tokens already seen (1 = off)");
ABSL_FLAG(float, presence_penalty, 0.0f, "generate: presence penalty [-2, 2]");
ABSL_FLAG(float, frequency_penalty, 0.0f, "generate: frequency penalty [-2, 2]");
ABSL_FLAG(int64_t, seed, -1, "generate: RNG seed; -1 = random");
ABSL_FLAG(bool, print_ids, false, "generate: print generated token ids, not text");
ABSL_FLAG(bool, ignore_eos, false, "generate: keep going past end-of-sequence tokens");
ABSL_FLAG(int, cpu_threads, 0, "generate: CPU kernel threads (0 = all cores)");
ABSL_FLAG(std::string, stats_json, "", "generate: write timing statistics as JSON to this file");
ABSL_FLAG(std::string, generate_target, "",
          "generate: a router's host:port; when set, the request goes through the cluster "
          "instead of running the model in-process");

namespace tessera::cli {

namespace {

// Streams one request through a router (tessera.v1.Inference).
int GenerateRemote(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = tessera::v1::Inference::NewStub(channel);
  tessera::v1::GenerateRequest req;
  if (!absl::GetFlag(FLAGS_prompt_ids).empty()) {
    for (const std::string& s : absl::GetFlag(FLAGS_prompt_ids)) {
      int32_t id;
      if (!absl::SimpleAtoi(s, &id)) {
        std::fprintf(stderr, "error: --prompt_ids: '%s' is not an id\n", s.c_str());
        return 1;
      }
      req.mutable_token_ids()->add_ids(id);
    }
  } else {
    req.set_text(absl::GetFlag(FLAGS_prompt));
    std::fputs(absl::GetFlag(FLAGS_prompt).c_str(), stdout);
  }
  tessera::v1::SamplingParams* sp = req.mutable_sampling();
  sp->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  sp->set_temperature(absl::GetFlag(FLAGS_temperature));
  sp->set_top_p(absl::GetFlag(FLAGS_top_p));
  sp->set_top_k(absl::GetFlag(FLAGS_top_k));
  if (absl::GetFlag(FLAGS_seed) >= 0) sp->set_seed(absl::GetFlag(FLAGS_seed));
  sp->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->Generate(&ctx, req);
  tessera::v1::GenerateResponse resp;
  tessera::v1::Complete complete;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      if (req.has_token_ids()) {
        for (int32_t t : resp.chunk().token_ids()) std::printf("%d ", t);
      } else {
        std::fputs(resp.chunk().text().c_str(), stdout);
      }
      std::fflush(stdout);
    }
    if (resp.has_complete()) complete = resp.complete();
  }
  grpc::Status status = reader->Finish();
  std::fputs("\n", stdout);
  std::fflush(stdout);  // the text before the summary on stderr, also when both are one file
  if (!status.ok()) {
    std::fprintf(stderr, "error: %s\n", status.error_message().c_str());
    return 1;
  }
  std::fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, finish: %s]\n",
               complete.usage().prompt_tokens(), complete.usage().cached_tokens(),
               complete.usage().completion_tokens(),
               tessera::v1::FinishReason_Name(complete.finish_reason()).c_str());
  return 0;
}

}  // namespace

int RunGenerate(const std::vector<char*>&) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  if (!absl::GetFlag(FLAGS_generate_target).empty()) {
    return GenerateRemote(absl::GetFlag(FLAGS_generate_target));
  }
  engine::LocalEngineOptions lo;
  lo.model_dir = absl::GetFlag(FLAGS_model);
  if (lo.model_dir.empty()) return fail(absl::InvalidArgumentError("--model is required"));
  lo.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  lo.kv_cache_memory_mb = 256;
  if (!absl::GetFlag(FLAGS_device).empty()) lo.device = absl::GetFlag(FLAGS_device);
  lo.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  std::string tok_dir =
      absl::GetFlag(FLAGS_tokenizer).empty() ? lo.model_dir : absl::GetFlag(FLAGS_tokenizer);
  const bool ids_in = !absl::GetFlag(FLAGS_prompt_ids).empty();
  if (ids_in == !absl::GetFlag(FLAGS_prompt).empty()) {
    return fail(absl::InvalidArgumentError("give exactly one of --prompt and --prompt_ids"));
  }
  // The tokenizer is needed for text in or out; with ids in it is optional.
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto t = Tokenizer::FromDirectory(tok_dir); t.ok()) {
    tokenizer = std::move(*t);
  } else if (!ids_in) {
    return fail(t.status());
  }
  absl::StatusOr<std::vector<int32_t>> prompt;
  if (ids_in) {
    prompt.emplace();
    for (const std::string& s : absl::GetFlag(FLAGS_prompt_ids)) {
      int32_t id;
      if (!absl::SimpleAtoi(s, &id)) {
        return fail(
            absl::InvalidArgumentError(absl::StrCat("--prompt_ids: '", s, "' is not an id")));
      }
      prompt->push_back(id);
    }
  } else {
    prompt = tokenizer->Encode(absl::GetFlag(FLAGS_prompt));
  }
  if (!prompt.ok()) return fail(prompt.status());
  if (prompt->empty()) return fail(absl::InvalidArgumentError("the prompt encodes to no tokens"));

  absl::Time load_start = absl::Now();
  auto local = engine::BuildLocalEngine(lo);
  if (!local.ok()) return fail(local.status());
  engine::Engine& eng = *(*local)->engine;
  absl::Duration load_time = absl::Now() - load_start;

  engine::EngineRequest req;
  req.prompt = *prompt;
  req.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  req.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  req.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  req.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  req.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  req.sampling.min_p = absl::GetFlag(FLAGS_min_p);
  req.sampling.repetition_penalty = absl::GetFlag(FLAGS_repetition_penalty);
  req.sampling.presence_penalty = absl::GetFlag(FLAGS_presence_penalty);
  req.sampling.frequency_penalty = absl::GetFlag(FLAGS_frequency_penalty);
  req.sampling.seed = absl::GetFlag(FLAGS_seed) >= 0
                          ? static_cast<uint64_t>(absl::GetFlag(FLAGS_seed))
                          : std::random_device{}();
  if (tokenizer && tokenizer->eos_token_id())
    req.stop_token_ids.push_back(*tokenizer->eos_token_id());

  eng.Start();
  absl::Time start = absl::Now();
  auto stream = eng.Submit(req);
  if (!stream.ok()) return fail(stream.status());
  std::optional<IncrementalDetokenizer> detok;
  if (tokenizer && !absl::GetFlag(FLAGS_print_ids)) {
    detok.emplace(tokenizer.get(), /*skip_special_tokens=*/true);
  }
  std::fputs(absl::GetFlag(FLAGS_prompt).c_str(), stdout);
  std::fflush(stdout);
  engine::StreamEvent event;
  std::optional<absl::Time> first_token;
  int generated = 0;
  while ((*stream)->Next(&event, absl::Seconds(600))) {
    if (!event.error.ok()) return fail(event.error);
    for (const engine::TokenReport& t : event.tokens) {
      if (!first_token) first_token = absl::Now();
      ++generated;
      if (detok) {
        auto text = detok->Add(t.token);
        if (!text.ok()) return fail(text.status());
        std::fputs(text->c_str(), stdout);
      } else {
        std::printf("%d ", t.token);
      }
      std::fflush(stdout);
    }
    if (event.finished) break;
  }
  if (detok) std::fputs(detok->Finish().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  absl::Time end = absl::Now();
  if (!event.finished) return fail(absl::DeadlineExceededError("generation did not finish"));

  double ttft = absl::ToDoubleSeconds(first_token.value_or(end) - start);
  double decode_s = absl::ToDoubleSeconds(end - first_token.value_or(end));
  double decode_tps = generated > 1 && decode_s > 0 ? (generated - 1) / decode_s : 0;
  nlohmann::json stats = {
      {"model", lo.model_dir},
      {"prompt_tokens", prompt->size()},
      {"generated_tokens", generated},
      {"finish_reason", std::string(engine::FinishReasonName(event.finish_reason))},
      {"load_seconds", absl::ToDoubleSeconds(load_time)},
      {"time_to_first_token_seconds", ttft},
      {"prefill_tokens_per_second", ttft > 0 ? prompt->size() / ttft : 0},
      {"decode_seconds", decode_s},
      {"decode_tokens_per_second", decode_tps},
      {"cpu_threads", lo.cpu_threads},
      {"backends", (*local)->backends.ToTable()},
  };
  std::fprintf(stderr, "[%zu prompt tokens, %d generated (%s); TTFT %.1f ms; decode %.1f tok/s]\n",
               prompt->size(), generated,
               std::string(engine::FinishReasonName(event.finish_reason)).c_str(), ttft * 1e3,
               decode_tps);
  if (!absl::GetFlag(FLAGS_stats_json).empty()) {
    std::ofstream out(absl::GetFlag(FLAGS_stats_json));
    out << stats.dump(2) << "\n";
    if (!out) return fail(absl::InternalError("cannot write --stats_json"));
  }
  return 0;
}

}  // namespace tessera::cli
