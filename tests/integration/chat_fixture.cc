#include "tests/integration/chat_fixture.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/test_process.h"
#include "text/tokenizer/tokenizer.h"

namespace tessera::testing {
namespace {

using nlohmann::json;

// Token ids: 0..2 special (pad, BOS, EOS = the simulated model's 2), bytes
// at 3..258, then the added tokens below.
constexpr int kByteBase = 3;

// A compact ChatML template in the style of Qwen3's: a system turn with the
// tools, tool calls as <tool_call> JSON, tool results as <tool_response>,
// thinking switched off by enable_thinking=false.
constexpr char kTemplate[] = R"JINJA({%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call functions. Signatures:\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nAnswer a call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{{- '\n<tool_call>\n{"name": "' + tool_call.function.name + '", "arguments": ' }}
{%- if tool_call.function.arguments is string %}{{- tool_call.function.arguments }}{%- else %}{{- tool_call.function.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %})JINJA";

const char* kAdded[] = {"<|im_start|>", "<|im_end|>", "<tools>", "<tool_response>"};

void WriteTokenizer(const std::string& dir) {
  // GPT-2's byte-to-character map, as WriteByteTokenizer uses.
  std::vector<int> bs, cs;
  for (int b = 0; b < 256; ++b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
      bs.push_back(b);
      cs.push_back(b);
    }
  }
  for (int b = 0, n = 0; b < 256; ++b) {
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  }
  json vocab = json::object();
  for (size_t i = 0; i < bs.size(); ++i) {
    std::string utf8;
    const int c = cs[i];
    if (c < 0x80) {
      utf8 += static_cast<char>(c);
    } else {
      utf8 += static_cast<char>(0xC0 | (c >> 6));
      utf8 += static_cast<char>(0x80 | (c & 0x3F));
    }
    vocab[utf8] = bs[i] + kByteBase;
  }
  json added = json::array();
  const char* specials[] = {"<pad>", "<s>", "<|endoftext|>"};
  for (int i = 0; i < 3; ++i) {
    vocab[specials[i]] = i;
    added.push_back({{"id", i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  int id = 256 + kByteBase;
  for (const char* t : kAdded) {
    const bool special = std::string(t).rfind("<|", 0) == 0;
    vocab[t] = id;
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  }
  json tj = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"byte_fallback", false}}},
  };
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  json config = {{"chat_template", kTemplate},   {"bos_token", nullptr},
                 {"eos_token", "<|endoftext|>"}, {"pad_token", "<pad>"},
                 {"add_bos_token", false},       {"add_eos_token", false}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  std::ofstream(dir + "/config.json") << json({{"model_type", "qwen3"}}).dump();
}

}  // namespace

std::string WriteChatModel(const std::string& dir, bool with_script, const std::string& extra) {
  WriteTokenizer(dir);
  std::string spec = "vocab=512,context=4096";
  if (!extra.empty()) spec += "," + extra;
  if (!with_script) return "--simulate=" + spec;
  auto tok = Tokenizer::FromDirectory(dir);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return "";
  json replies = json::array();
  for (const char* r : {kReplyPlain, kReplyToolCall, kReplyAfterTool}) {
    EncodeOptions eo;
    eo.add_special_tokens = false;
    auto ids = (*tok)->Encode(r, eo);
    EXPECT_TRUE(ids.ok());
    replies.push_back(*ids);
  }
  json script = {
      {"replies", replies},
      {"switch_tokens", {*(*tok)->TokenToId("<tools>"), *(*tok)->TokenToId("<tool_response>")}}};
  std::ofstream(dir + "/script.json") << script.dump();
  return absl::StrCat("--simulate=", spec, ",script=", dir, "/script.json");
}

ChatCluster StartChatCluster(int workers, std::vector<std::string> router_args, bool with_script,
                             const std::string& sim_extra, const std::string& api_key,
                             std::vector<std::string> worker_args) {
  ChatCluster c;
  c.model_dir = MakeTempDir();
  worker_args.insert(worker_args.begin(), WriteChatModel(c.model_dir, with_script, sim_extra));
  router_args.push_back("--tokenizer=" + c.model_dir);
  router_args.push_back("--http_listen=127.0.0.1:0");
  c.cluster = StartCluster(workers, worker_args, std::move(router_args), api_key);
  EXPECT_GT(c.http_port(), 0);
  return c;
}

namespace {

std::string BuildRequest(const std::string& method, const std::string& path,
                         const std::string& body, const std::map<std::string, std::string>& h) {
  std::string req =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n", "Connection: close\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  for (const auto& [k, v] : h) absl::StrAppend(&req, k, ": ", v, "\r\n");
  req += "\r\n";
  req += body;
  return req;
}

bool WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t len = 0;
    if (!absl::SimpleHexAtoi(raw.substr(pos, eol - pos), &len) || len == 0) break;
    out += raw.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return out;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpCall(int port, const std::string& method, const std::string& path,
                                      const std::string& body,
                                      const std::map<std::string, std::string>& headers) {
  absl::StatusOr<int> fd = ConnectLoopback(port);
  if (!fd.ok()) return fd.status();
  // The body may be refused before it is all sent (413): write what the
  // server takes, then read its answer.
  (void)WriteAll(*fd, BuildRequest(method, path, body, headers));
  std::string raw;
  char buf[16384];
  ssize_t n;
  while ((n = read(*fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  close(*fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("no HTTP response head in ", raw.size(), " bytes"));
  }
  HttpResponse r;
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &r.status)) {
    return absl::UnavailableError("bad status line: " + lines[0]);
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  r.body = raw.substr(end + 4);
  if (r.headers["transfer-encoding"] == "chunked") r.body = Dechunk(r.body);
  return r;
}

std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&event, "data: ")) out.emplace_back(event);
  }
  return out;
}

HttpStream::~HttpStream() { Close(); }

absl::Status HttpStream::Open(int port, const std::string& path, const std::string& body) {
  absl::StatusOr<int> fd = ConnectLoopback(port);
  if (!fd.ok()) return fd.status();
  fd_ = *fd;
  if (!WriteAll(fd_, BuildRequest("POST", path, body, {}))) {
    return absl::UnavailableError("cannot send the request");
  }
  return absl::OkStatus();
}

bool HttpStream::ReadUntil(const std::string& needle, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  char buf[4096];
  while (received_.find(needle) == std::string::npos) {
    const int64_t ms = absl::ToInt64Milliseconds(until - absl::Now());
    if (ms <= 0) return false;
    struct pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(ms)) <= 0) return false;
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) return received_.find(needle) != std::string::npos;
    received_.append(buf, static_cast<size_t>(n));
  }
  return true;
}

bool HttpStream::ReadSome(absl::Duration timeout) {
  struct pollfd p = {fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <= 0) return false;
  char buf[8192];
  const ssize_t n = read(fd_, buf, sizeof(buf));
  if (n <= 0) return false;
  received_.append(buf, static_cast<size_t>(n));
  return true;
}

void HttpStream::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace tessera::testing
