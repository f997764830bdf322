#include "lib/model/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

namespace vtoken::model {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512};

CpuIsa Detect() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("x86-64-v3")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

std::atomic<int>& Active() {
  static std::atomic<int> active{static_cast<int>(HostCpuIsa())};
  return active;
}

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kBaseline:
      break;
  }
  return "baseline";
}

StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : kAll) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return InvalidArgumentError("CPU ISA '" + std::string(name) +
                              "': must be one of baseline, avx2, avx512");
}

CpuIsa HostCpuIsa() {
  static const CpuIsa host = Detect();
  return host;
}

std::vector<CpuIsa> HostCpuIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : kAll) {
    if (static_cast<int>(isa) <= static_cast<int>(HostCpuIsa())) isas.push_back(isa);
  }
  return isas;
}

CpuIsa ActiveCpuIsa() { return static_cast<CpuIsa>(Active().load(std::memory_order_relaxed)); }

Status SetCpuIsa(CpuIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(HostCpuIsa())) {
    return InvalidArgumentError("CPU ISA " + std::string(CpuIsaName(isa)) + ": this CPU has " +
                                std::string(CpuIsaName(HostCpuIsa())) + " at most");
  }
  Active().store(static_cast<int>(isa), std::memory_order_relaxed);
  return Status::Ok();
}

Status ApplyCpuIsaEnvironment() {
  const char* value = std::getenv("VTOKEN_CPU_ISA");
  if (value == nullptr || *value == '\0') return Status::Ok();
  StatusOr<CpuIsa> isa = ParseCpuIsa(value);
  Status applied = isa.ok() ? SetCpuIsa(*isa) : isa.status();
  if (applied.ok()) return applied;
  return InvalidArgumentError("VTOKEN_CPU_ISA: " + applied.message());
}

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t first = line.find_first_not_of(" \t", colon + 1);
    if (first == std::string::npos) break;
    return line.substr(first);
  }
  return "unknown";
}

}  // namespace vtoken::model
