// Whole-file I/O that the model file formats share (safetensors.cc, gguf.cc, gguf_writer.cc), so
// that each of them holds only its format: MappedFile, a file mapped read-only, and
// WriteFileAtomically, which replaces a file with new bytes so that readers never see a part.
//
// Errors name the file and carry strerror's text: NotFound for a missing file, InvalidArgument for
// every other I/O failure (the readers' and writers' documented codes).
//
// Thread safety: a MappedFile is immutable after Open; concurrent readers are safe. A FileSink
// belongs to the one WriteFileAtomically call that made it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "lib/core/status.h"

namespace vtoken::model {

// A whole file, mapped read-only and private. Movable, not copyable; the mapped bytes never
// move, so pointers into data() stay valid across moves until the last owner is destroyed.
class MappedFile {
 public:
  // Maps `path`. Errors: NotFound "<path>: no such file"; InvalidArgument
  // "<path>: cannot open: ...", "<path>: cannot stat: ...", "<path>: mmap failed: ...".
  // An empty file gives a MappedFile of no bytes (mmap refuses an empty mapping).
  static StatusOr<MappedFile> Open(const std::string& path);

  // No bytes: data() is null, size() 0.
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The file's bytes; null when size() is 0.
  const std::byte* data() const { return static_cast<const std::byte*>(map_); }
  size_t size() const { return size_; }

 private:
  void Unmap();

  void* map_ = nullptr;
  size_t size_ = 0;
};

// Where WriteFileAtomically's callback writes the new file's bytes, in order.
class FileSink {
 public:
  // Appends `size` bytes from `data` (which may be null when `size` is 0), through short writes
  // and EINTR. Returns InvalidArgument "<temporary>: write failed: ..." on failure.
  Status Write(const void* data, size_t size);

 private:
  friend Status WriteFileAtomically(const std::string& path,
                                    const std::function<Status(FileSink&)>& write_contents);
  FileSink(int fd, const std::string& path) : fd_(fd), path_(path) {}

  int fd_;
  const std::string& path_;  // the temporary file, for errors
};

// Replaces `path` with the bytes `write_contents` writes: they go to a temporary file beside it,
// "<path>.tmp.<pid>", which is fsynced (else a crash could leave `path` naming an empty file) and
// renamed over `path`. Returns the first error of `write_contents` or of these steps, after
// removing the temporary file: InvalidArgument "<temporary>: cannot create: ...",
// "<temporary>: fsync failed: ...", "<temporary>: close failed: ...",
// "<path>: rename from <temporary> failed: ...".
Status WriteFileAtomically(const std::string& path,
                           const std::function<Status(FileSink&)>& write_contents);

}  // namespace vtoken::model
