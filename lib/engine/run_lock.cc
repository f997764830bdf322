#include "lib/engine/run_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <utility>

namespace vtoken::engine {
namespace {

struct flock ByteOf(int64_t run_id, short type) {
  struct flock f {};
  f.l_type = type;
  f.l_whence = SEEK_SET;
  f.l_start = static_cast<off_t>(run_id);
  f.l_len = 1;
  return f;
}

// This process's open description of one lock file and the runs it holds there.
struct Holder {
  int fd = -1;
  pid_t pid = 0;  // process that opened `fd`; another one is a fork() child's inherited copy
  std::set<int64_t> runs;
};

std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}

// Keyed by the lock file's absolute path. REQUIRES: RegistryMutex() held.
std::map<std::string, Holder>& Registry() {
  static auto* holders = new std::map<std::string, Holder>();
  return *holders;
}

std::string Key(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : abs.string();
}

// This process's holder of `path`, opening the file if needed. REQUIRES: RegistryMutex() held.
StatusOr<Holder*> HolderOf(const std::string& path) {
  Holder& h = Registry()[Key(path)];
  if (h.fd >= 0 && h.pid != ::getpid()) {  // inherited through fork(): the parent's locks
    ::close(h.fd);
    h = Holder();
  }
  if (h.fd < 0) {
    h.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (h.fd < 0) return NotFoundError("cannot open " + path + ": " + std::strerror(errno));
    h.pid = ::getpid();
  }
  return &h;
}

}  // namespace

RunLocks::RunLocks(std::string db_path)
    : lock_path_(db_path.empty() ? "" : std::move(db_path) + "-runlock") {}

Status RunLocks::Lock(int64_t run_id) const {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  VTOKEN_ASSIGN_OR_RETURN(Holder * h, HolderOf(lock_path_));
  struct flock f = ByteOf(run_id, F_WRLCK);
  if (::fcntl(h->fd, F_OFD_SETLK, &f) != 0) {
    if (errno == EAGAIN || errno == EACCES) {
      return FailedPreconditionError(lock_path_ + ": run " + std::to_string(run_id) +
                                     " is locked by another process");
    }
    return InternalError(lock_path_ + ": cannot lock run " + std::to_string(run_id) + ": " +
                         std::strerror(errno));
  }
  h->runs.insert(run_id);
  return Status::Ok();
}

void RunLocks::Unlock(int64_t run_id) const {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(Key(lock_path_));
  if (it == Registry().end() || it->second.pid != ::getpid()) return;
  if (it->second.runs.erase(run_id) == 0) return;
  struct flock f = ByteOf(run_id, F_UNLCK);
  ::fcntl(it->second.fd, F_OFD_SETLK, &f);
}

bool RunLocks::Held(int64_t run_id) const {
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    auto it = Registry().find(Key(lock_path_));
    if (it != Registry().end() && it->second.pid == ::getpid() && it->second.runs.count(run_id)) {
      return true;
    }
  }
  // Another process's lock, seen through a description of our own (read-only suffices: a read
  // lock is what is asked about, and it conflicts with a writer's lock). No file: no writer.
  const int fd = ::open(lock_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  struct flock f = ByteOf(run_id, F_RDLCK);
  const bool held = ::fcntl(fd, F_OFD_GETLK, &f) != 0 || f.l_type != F_UNLCK;
  ::close(fd);
  return held;
}

}  // namespace vtoken::engine
