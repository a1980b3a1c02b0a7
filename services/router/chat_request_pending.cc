// Stand-in for chat_request.cc while text/chat (the chat template library)
// is not in the tree: chat is refused. Removed once text/chat lands.
#include "services/router/chat_request.h"
namespace tessera::text { class ChatTemplate {}; }
namespace tessera::services {
ChatRenderer::ChatRenderer(std::unique_ptr<text::ChatTemplate> t, std::string f, bool r)
    : template_(std::move(t)), tool_format_(std::move(f)), reasoning_(r) {}
ChatRenderer::~ChatRenderer() = default;
absl::StatusOr<std::unique_ptr<ChatRenderer>> ChatRenderer::Load(const std::string&, const ChatOptions&) {
  return absl::NotFoundError("chat templates are not built yet");
}
absl::StatusOr<std::unique_ptr<ChatRenderer>> ChatRenderer::FromSource(
    const std::string&, const std::string&, const std::string&, const std::string&, const ChatOptions&) {
  return absl::NotFoundError("chat templates are not built yet");
}
absl::StatusOr<RenderedChat> ChatRenderer::Render(const tessera::v1::ChatRequest&) const {
  return absl::UnimplementedError("chat templates are not built yet");
}
}  // namespace tessera::services
