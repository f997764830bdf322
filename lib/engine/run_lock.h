// RunLocks: which runs of a result database a live process is recording. The writer of a run
// holds a lock on byte `run_id` of the file "<db>-runlock" beside the database from BeginRun
// until the run ends (or its FailRun / InterruptRun gives up on it); the kernel drops the lock
// when the process dies, kill -9 included and before a zombie is reaped. Any other open of the
// database tests the lock, so a run whose writer is gone is found without trusting a pid,
// which a dead process can share with a live one (pid reuse, another pid namespace) or keep as
// a zombie. The file is on the database's file system: a database shared between machines
// needs a file system with working locks (a local disk, NFSv4).
//
// Locks belong to the process, not to a ResultStore: a store closed before its run ends leaves
// the run to its process (which may open the database again and end it). They are Linux open
// file description locks (F_OFD_SETLK) on one description per lock file per process, so opening
// and closing the file elsewhere in the process drops none of them (as POSIX locks would), and
// a child made by fork() drops its inherited copy before taking locks of its own. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "lib/core/status.h"

namespace vtoken::engine {

class RunLocks {
 public:
  // The run locks of the database at `db_path`.
  explicit RunLocks(std::string db_path = "");

  const std::string& path() const { return lock_path_; }

  // Takes the lock of `run_id` for this process, creating the lock file if needed.
  // kFailedPrecondition when another process holds it; kNotFound when the lock file cannot be
  // opened; kInternal when the file system refuses the lock.
  Status Lock(int64_t run_id) const;
  // Releases the lock of `run_id` if this process holds it.
  void Unlock(int64_t run_id) const;
  // Whether a live process (this one included) holds the lock of `run_id`; true when the file
  // system cannot tell, so that a run is never taken from a writer that may be alive.
  bool Held(int64_t run_id) const;

 private:
  std::string lock_path_;
};

}  // namespace vtoken::engine
