#include "lib/engine/run_lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace vtoken::engine {
namespace {

namespace fs = std::filesystem;

class RunLocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = (fs::temp_directory_path() /
           ("vtoken_run_lock_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db"))
              .string();
    fs::remove(db_ + "-runlock");
  }
  void TearDown() override { fs::remove(db_ + "-runlock"); }

  // Forks a child that takes the lock of `run_id` and waits to be killed; returns its pid once
  // it holds the lock.
  pid_t ChildHolding(int64_t run_id) {
    int fd[2];
    EXPECT_EQ(::pipe(fd), 0);
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(fd[0]);
      const char ok = RunLocks(db_).Lock(run_id).ok() ? 'y' : 'n';
      if (::write(fd[1], &ok, 1) != 1) ::_exit(1);
      while (true) ::pause();
    }
    ::close(fd[1]);
    char ok = 0;
    EXPECT_EQ(::read(fd[0], &ok, 1), 1);
    EXPECT_EQ(ok, 'y');
    ::close(fd[0]);
    return child;
  }

  std::string db_;
};

TEST_F(RunLocksTest, NoFileMeansNothingHeld) {
  EXPECT_FALSE(RunLocks(db_).Held(1));
  EXPECT_FALSE(fs::exists(db_ + "-runlock"));  // testing creates nothing
}

TEST_F(RunLocksTest, ThisProcessHoldsUntilUnlock) {
  const RunLocks a(db_), b(db_);  // two stores of one process share its locks
  ASSERT_TRUE(a.Lock(3).ok());
  EXPECT_TRUE(a.Held(3));
  EXPECT_TRUE(b.Held(3));
  EXPECT_FALSE(b.Held(4));
  b.Unlock(3);
  EXPECT_FALSE(a.Held(3));
}

TEST_F(RunLocksTest, AnotherProcessHoldsUntilItDiesUnreaped) {
  const pid_t child = ChildHolding(5);
  const RunLocks locks(db_);
  EXPECT_TRUE(locks.Held(5));
  EXPECT_FALSE(locks.Held(6));
  EXPECT_EQ(locks.Lock(5).code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // Not reaped yet: a zombie keeps its pid but not its locks.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(::kill(child, 0), 0);  // the pid still names a process
  EXPECT_FALSE(locks.Held(5));
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(locks.Lock(5).ok());
  locks.Unlock(5);
}

}  // namespace
}  // namespace vtoken::engine
