// atomic_write (atomic_file.h): temporary file, fsync, rename, fsync of
// the directory, with POSIX calls so that every step's error is seen.

#include "sparsecomm/core/atomic_file.h"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "sparsecomm/core/errors.h"

namespace sparsecomm {
namespace {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

// Closes a descriptor on every path out.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  // Closes now, reporting the error (a deferred write error can show here).
  bool close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

fs::path temporary_for(const fs::path& path) {
  static std::atomic<std::uint64_t> counter{0};
  return path.parent_path() /
         fmt::format(".{}.tmp.{}.{}", path.filename().string(), ::getpid(), counter++);
}

void write_all(int fd, std::span<const std::byte> bytes, const fs::path& temp) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t wrote = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("cannot write {}: {}", temp.string(), errno_text()));
    }
    done += static_cast<std::size_t>(wrote);
  }
}

}  // namespace

void fsync_directory(const fs::path& directory) {
  const fs::path dir = directory.empty() ? fs::path(".") : directory;
  Descriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
    throw Error(fmt::format("cannot sync the directory {}: {}", dir.string(), errno_text()));
  }
}

void atomic_write(const fs::path& path, std::span<const std::byte> bytes) {
  const fs::path temp = temporary_for(path);
  try {
    Descriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      throw Error(fmt::format("cannot create {}: {}", temp.string(), errno_text()));
    }
    write_all(fd.get(), bytes, temp);
    if (::fsync(fd.get()) != 0) {
      throw Error(fmt::format("cannot sync {} to disk: {}", temp.string(), errno_text()));
    }
    if (!fd.close()) {
      throw Error(fmt::format("cannot close {}: {}", temp.string(), errno_text()));
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      throw Error(
          fmt::format("cannot rename {} to {}: {}", temp.string(), path.string(), errno_text()));
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw;
  }
  fsync_directory(path.parent_path());
}

void atomic_write(const fs::path& path, std::string_view text) {
  atomic_write(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

}  // namespace sparsecomm
