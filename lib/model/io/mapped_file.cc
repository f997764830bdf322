#include "lib/model/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace vtoken::model {

StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(path + ": no such file");
    return InvalidArgumentError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return InvalidArgumentError(path + ": cannot stat: " + std::strerror(err));
  }
  MappedFile file;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return file;
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // The mapping keeps the file alive.
  if (map == MAP_FAILED) {
    return InvalidArgumentError(path + ": mmap failed: " + std::strerror(map_errno));
  }
  file.map_ = map;
  file.size_ = size;
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

Status FileSink::Write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return InvalidArgumentError(path_ + ": write failed: " + std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path,
                           const std::function<Status(FileSink&)>& write_contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return InvalidArgumentError(tmp + ": cannot create: " + std::strerror(errno));
  FileSink sink(fd, tmp);
  Status s = write_contents(sink);
  if (s.ok() && ::fsync(fd) != 0) {
    s = InvalidArgumentError(tmp + ": fsync failed: " + std::strerror(errno));
  }
  if (::close(fd) != 0 && s.ok()) {
    s = InvalidArgumentError(tmp + ": close failed: " + std::strerror(errno));
  }
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = InvalidArgumentError(path + ": rename from " + tmp + " failed: " + std::strerror(errno));
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace vtoken::model
