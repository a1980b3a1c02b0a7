#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "base/str_cat.h"

namespace tessera {

absl::StatusOr<std::string> ReadFileBounded(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        Cat(path, ": cannot open: ", std::strerror(err)));
  }
  std::string text;
  absl::Status status;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = absl::InvalidArgumentError(Cat(path, ": not a regular file"));
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    status = absl::InvalidArgumentError(
        Cat(path, ": file is ", st.st_size, " bytes, more than the limit of ", max_bytes));
  } else {
    text.reserve(static_cast<size_t>(st.st_size));
    char buffer[1 << 16];
    while (true) {
      const ssize_t got = read(fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status = absl::DataLossError(Cat(path, ": read error: ", std::strerror(errno)));
        break;
      }
      if (got == 0) break;
      text.append(buffer, static_cast<size_t>(got));
      if (text.size() > max_bytes) {
        status = absl::InvalidArgumentError(
            Cat(path, ": file grew past the limit of ", max_bytes, " bytes"));
        break;
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace tessera
