// Policies written in Python, run inside the engine: a class in a .py file, loaded into an
// interpreter embedded in the process and registered in the policy registry under its own name,
// so that every place that takes a policy name (vtoken-cli run / sweep / check / generate /
// policies) takes it, with the same budgets, protection, granularity and results as a C++ policy.
// docs/WRITING_A_POLICY.md, "A policy in Python", documents the class; in short:
//
//   class PyH2O:
//       name = "py_h2o"             # registered name (snake_case, not taken)
//       rule = "..."                # one line (optional)
//       signals = ["attn_sum"]      # attn, attn_sum, key_norm and registered token signals
//       state_size = 0              # floats of per-token state (optional)
//       params = {"recent_ratio": 0.5}   # name -> default: float, int, bool or str (optional)
//       def __init__(self, recent_ratio): ...        # called with every parameter by name
//       def score(self, tokens, ctx): -> n scores    # higher = keep
//       def observe(self, tokens, ctx): ...          # optional; writes tokens["state"] in place
//
// `tokens` is a dict of numpy arrays, one entry per live token of the group in logical order:
// position and age (int64), each declared signal by name (float32) and, with state, "state"
// ((n, state_size) float32, the evictor's own memory: observe writes it, score must not). `ctx`
// is a dict: step, budget, group and seed (64 random bits drawn from the sequence's PolicyRng).
//
// Cost: each call converts the live tokens' views into numpy arrays and takes the interpreter's
// lock, so calls from the engine's policy threads run one at a time. A Python exception or a
// score array of the wrong size during a run becomes the policy's failure() (policy.h), which
// the evictor returns, so the run fails with one line naming it as with any other error;
// RegisterPythonPolicy runs score once on eight synthetic tokens so that most mistakes are
// reported before a run starts. Only constructing the class with parameters other than its
// defaults has no Status to fail with (PolicyInfo::factory): a raise there prints one line and
// exits with status 1.
#pragma once

#include <string>
#include <string_view>

#include "lib/core/status.h"

namespace vtoken {

// True when this build embeds Python (python3-dev and pybind11-dev were found by CMake).
bool PythonPoliciesAvailable();

// Loads class CLASS of FILE for `spec` = "FILE:CLASS" (FILE a path ending in .py; its directory
// is put first on the interpreter's sys.path), checks it and registers it (RegisterPolicy),
// starting the interpreter on the first call. Returns the registered name. InvalidArgument naming
// the spec for a malformed spec, a class that breaks the contract above (missing score, bad name,
// unknown signal, bad params or state_size, a score that fails on synthetic tokens); NotFound for
// a missing file or class; FailedPrecondition for a name already registered or a build without
// Python. Call before any thread uses the registry.
StatusOr<std::string> RegisterPythonPolicy(std::string_view spec);

// RegisterPythonPolicy for each comma-separated spec of the environment variable
// VTOKEN_PYTHON_POLICIES (unset or empty: nothing). The first error, naming the variable.
Status RegisterPythonPoliciesFromEnvironment();

}  // namespace vtoken
