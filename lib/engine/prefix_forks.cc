#include "lib/engine/prefix_forks.h"

namespace vtoken::engine {

void PrefixForks::Admitted(size_t index) {
  SeqState& s = seqs_[index];
  s.awaiting_fork = false;
  if (s.shared_tokens == 0) return;
  const int32_t group = s.request->prefix_group;
  auto it = leaders_.find(group);
  if (it == leaders_.end() || !IsLeaderForkable(it->second, s.shared_tokens)) {
    leaders_[group] = index;
  } else {
    s.awaiting_fork = true;
  }
}

Status PrefixForks::Computed(size_t index) {
  const SeqState& l = seqs_[index];
  if (l.shared_tokens == 0 || l.num_computed != l.shared_tokens) return Status::Ok();
  auto it = leaders_.find(l.request->prefix_group);
  if (it == leaders_.end() || it->second != index) return Status::Ok();
  for (size_t member : running_) {
    SeqState& m = seqs_[member];
    if (!m.awaiting_fork || m.request->prefix_group != l.request->prefix_group) continue;
    VTOKEN_RETURN_IF_ERROR(cache_.FreeSequence(m.seq));
    VTOKEN_ASSIGN_OR_RETURN(ForkResult fork, cache_.ForkSequence(l.seq, l.num_computed));
    if (!fork.copies.empty()) copies_.Wait(copies_.Submit(fork.copies));
    m.seq = fork.child;
    cache_.ReserveTokens(m.seq, static_cast<int64_t>(m.tokens.size()) + m.request->max_tokens);
    m.num_computed = l.num_computed;
    m.awaiting_fork = false;
    m.prefix_request = l.request->id;
    ++num_forks_;
  }
  return Status::Ok();
}

void PrefixForks::Leaving(size_t index) {
  const SeqState& l = seqs_[index];
  if (l.shared_tokens == 0) return;
  for (size_t member : running_) {
    if (seqs_[member].request->prefix_group == l.request->prefix_group) {
      seqs_[member].awaiting_fork = false;
    }
  }
  auto it = leaders_.find(l.request->prefix_group);
  if (it != leaders_.end() && it->second == index) leaders_.erase(it);
}

bool PrefixForks::IsLeaderForkable(size_t leader, int64_t shared_tokens) const {
  const SeqState& l = seqs_[leader];
  return l.seq != kNoSeq && !l.observed && !l.awaiting_fork && l.num_computed <= shared_tokens &&
         l.shared_tokens == shared_tokens;
}

}  // namespace vtoken::engine
