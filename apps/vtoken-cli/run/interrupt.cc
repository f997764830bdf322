#include "apps/vtoken-cli/run/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace vtoken::cli {
namespace {

std::atomic<int> g_signal{0};

void Write(const char* text) {
  const ssize_t ignored = ::write(2, text, std::strlen(text));
  (void)ignored;
}

void OnSignal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {
    Write("\nvtoken-cli: second signal: exiting now\n");
    ::_exit(128 + sig);
  }
  Write("\nvtoken-cli: interrupted: finishing the current step (signal again to exit now)\n");
}

}  // namespace

void InstallInterruptHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int InterruptSignal() { return g_signal.load(); }

int InterruptExitCode() { return 128 + g_signal.load(); }

const char* InterruptSignalName() { return g_signal.load() == SIGTERM ? "SIGTERM" : "SIGINT"; }

}  // namespace vtoken::cli
