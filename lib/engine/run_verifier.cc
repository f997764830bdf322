#include "lib/engine/run_verifier.h"

#include <utility>

namespace vtoken::engine {

void RunVerifier::BeforeCopy(const Relocation& rel) {
  std::vector<SlotIndex> srcs, dsts;
  for (const SeqRelocation& s : rel.seqs) {
    for (const Move& m : s.moves) {
      srcs.push_back(m.src);
      dsts.push_back(m.dst);
    }
  }
  const std::vector<uint64_t> hashes = runner_.TokenKvHashes(srcs);
  if (!CountMatches(hashes, srcs)) return;
  for (size_t i = 0; i < dsts.size(); ++i) before_[dsts[i]] = hashes[i];
}

void RunVerifier::AfterCopy(const Relocation& rel) {
  std::vector<SlotIndex> dsts;
  for (const SeqRelocation& s : rel.seqs) {
    for (const Move& m : s.moves) dsts.push_back(m.dst);
  }
  const std::vector<uint64_t> after = runner_.TokenKvHashes(dsts);
  if (!CountMatches(after, dsts)) return;
  size_t next = 0;
  for (const SeqRelocation& s : rel.seqs) {
    for (const Move& m : s.moves) {
      ++result_.hash_checks;
      auto it = before_.find(m.dst);
      if (it == before_.end() || it->second != after[next++]) {
        AddViolation("hash mismatch: token " + std::to_string(m.token) + " of sequence " +
                     std::to_string(s.seq) + " moved " + std::to_string(m.src) + " -> " +
                     std::to_string(m.dst));
      }
      if (it != before_.end()) before_.erase(it);
    }
  }
}

void RunVerifier::CheckCache(const VirtualKvCache& cache) {
  ++result_.invariant_checks;
  Status s = cache.CheckInvariants();
  if (!s.ok()) AddViolation(s.ToString());
}

bool RunVerifier::CountMatches(const std::vector<uint64_t>& hashes,
                               const std::vector<SlotIndex>& slots) {
  if (hashes.size() == slots.size()) return true;
  AddViolation("the runner returned " + std::to_string(hashes.size()) + " KV hashes for " +
               std::to_string(slots.size()) + " slots");
  return false;
}

void RunVerifier::AddViolation(std::string description) {
  ++result_.violations;
  if (result_.first_violations.size() < kMaxDescribed) {
    result_.first_violations.push_back(std::move(description));
  }
}

}  // namespace vtoken::engine
