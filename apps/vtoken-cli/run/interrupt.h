// SIGINT / SIGTERM while a command writes results: the first signal asks the work to stop at the
// next safe point (a run finishes its current step, is marked 'interrupted' and the process exits
// 128 + signal: 130 for SIGINT, 143 for SIGTERM); a second signal exits at once.
//
// The handlers only set a flag and write a fixed message; everything else runs in the thread
// that polls InterruptSignal().
#pragma once

namespace vtoken::cli {

// Installs the handlers (idempotent).
void InstallInterruptHandlers();

// The first signal received since InstallInterruptHandlers, or 0.
int InterruptSignal();

// 128 + InterruptSignal(). REQUIRES: InterruptSignal() != 0.
int InterruptExitCode();

// "SIGINT" / "SIGTERM".
const char* InterruptSignalName();

}  // namespace vtoken::cli
