// KV eviction after attention: score accumulation, victim selection, in-place compaction.
#include "engine/kv_evict.h"

#include <algorithm>
#include <cstring>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/error.h"
#include "core/tensor.h"
#include "policies/keep_list.h"

namespace flexh2o {

namespace {

struct WindowScratch {
  std::vector<int32_t> inside, pos, victims;
  std::vector<float> acc;
};

// Victims of a sliding-window layer's row of n slots: every slot the next query cannot see
// (position <= newest - window + 1), then the policy's choice among the others, which it sees as
// a row of their own. check_window_budgets() makes sure enough of them remain.
void window_victims(const EvictArgs& a, int64_t b, int64_t h, const float* acc, const int32_t* pos, int64_t n,
                    int64_t keep_n, uint64_t salt, WindowScratch& w, std::vector<int32_t>& victims) {
  const int64_t newest = int64_t(a.seen_before[b]) + (n - a.len_before[b]) - 1;
  const int64_t first = newest - a.seg.window + 2;  // the oldest position the next query sees
  victims.clear();
  w.inside.clear(), w.pos.clear(), w.acc.clear();
  for (int64_t s = 0; s < n; ++s) {
    if (pos[s] < first) {
      victims.push_back(int32_t(s));
    } else {
      w.inside.push_back(int32_t(s));
      w.pos.push_back(pos[s]);
      w.acc.push_back(acc[s]);
    }
  }
  const int64_t inside = int64_t(w.inside.size());
  FH_CHECK(inside >= keep_n, "KV policy: sequence ", b, " head ", h, " keeps ", keep_n, " tokens but only ", inside,
           " lie inside the layer's sliding window of ", a.seg.window, " (check_window_budgets refuses this budget)");
  if (inside == keep_n) return;
  const SlotView view{{w.acc.data(), w.acc.size()}, {w.pos.data(), w.pos.size()}, salt};
  a.policy->select_victims(view, a.budgets[b], keep_n, w.victims);
  for (int32_t v : w.victims) victims.push_back(w.inside[size_t(v)]);
  std::sort(victims.begin(), victims.end());
}

}  // namespace

void check_window_budgets(const ModelConfig& c, std::span<const KvBudget> budgets, int64_t max_len,
                          std::span<const int64_t> lengths) {
  if (c.sliding_window == 0 || max_len <= c.sliding_window) return;
  for (size_t b = 0; b < budgets.size(); ++b)
    if (!budgets[b].unbounded && budgets[b].total() > c.sliding_window)
      FH_FAIL("KV budget of ", budgets[b].total(), " tokens (",
              b < lengths.size() ? detail::concat("of a sequence whose budget's basis is ", lengths[b], " tokens")
                                 : detail::concat("sequence ", b),
              ") is more than the ", c.sliding_window,
              "-token sliding window of this model's sliding-window layers, and sequences may reach ", max_len,
              " tokens: those layers keep only their window, so the budget must fit it (a lower "
              "--heavy-ratio/--recent-ratio, absolute --heavy-budget/--recent-budget, or the full cache)");
}

bool window_caps_full_cache(const ModelConfig& c, int64_t max_len) {
  if (c.sliding_window == 0 || max_len <= c.sliding_window || c.n_layers < 1) return false;
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (c.attention_window(l) == 0) return false;
  return true;
}

int64_t count_sliding_layers(const ModelConfig& c) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) n += c.attention_window(l) > 0;
  return n;
}

bool any_bounded(std::span<const KvBudget> budgets) {
  return std::any_of(budgets.begin(), budgets.end(), [](const KvBudget& b) { return !b.unbounded; });
}

int64_t full_cache_window(const ModelConfig& c, bool kv_policy, int64_t max_len) {
  if (kv_policy || c.sliding_window == 0 || max_len <= c.sliding_window) return 0;
  return count_sliding_layers(c) > 0 ? c.sliding_window : 0;
}

KvPolicyConfig window_local_policy(const ModelConfig& c) {
  KvPolicyConfig local;
  local.kind = KvPolicyKind::kLocal;
  local.recent_budget = c.sliding_window;
  return local;
}

KvPolicyConfig window_kv_policy(const ModelConfig& c, const KvPolicyConfig& kv, int64_t max_len) {
  if (kv.kind != KvPolicyKind::kFull || !window_caps_full_cache(c, max_len)) return kv;
  return window_local_policy(c);
}

void decide_kv_policy(const EvictArgs& a, const KvKeepFn& move) {
  const ModelConfig& c = *a.config;
  const int64_t kvh = c.n_kv_heads, cap = a.score_capacity ? a.score_capacity : a.seg.capacity;
  const int64_t group = c.n_heads / c.n_kv_heads;
  a.dirty_lo->assign(size_t(a.seg.n_seq * kvh), 0);
  a.dirty_hi->assign(size_t(a.seg.n_seq * kvh), 0);
  if (!a.state) {  // the new rows stay where they were written
    for (int64_t b = 0; b < a.seg.n_seq; ++b) {
      FH_CHECK(a.budgets[b].unbounded, "KV policy: sequence ", b, " has a bounded budget but no policy state");
      for (int64_t h = 0; h < kvh; ++h) {
        (*a.dirty_lo)[size_t(b * kvh + h)] = a.len_before[b];
        (*a.dirty_hi)[size_t(b * kvh + h)] = a.len_after[b];
      }
    }
    return;
  }
  const int64_t scap = a.state->capacity;  // the state may be wider than this segment's buffer
  FH_CHECK(a.state->kv_heads == kvh, "policy state shape mismatch");
  // Sequences are independent (their own state rows, K/V rows, keep lists and dirty ranges; the
  // policy is immutable), so they are decided in parallel with the same result: on one thread the
  // host queue's decisions (OPT-30B: 144 sequences x 56 heads x 48 layers a token step) left the
  // other cores idle while the step waited on them.
  auto decide = [&](int64_t b, std::vector<int32_t>& victims, std::vector<int32_t>& keep, WindowScratch& scratch) {
    const int64_t before = a.len_before[b], n = a.len_after[b];
    const int64_t keep_n = a.budgets[b].kept(n);
    FH_CHECK(n <= scap, "policy state holds ", scap, " slots, sequence has ", n);
    for (int64_t h = 0; h < kvh; ++h) {
      const int64_t row = ((a.state_first + b) * kvh + h) * scap;
      float* acc = a.state->acc.data() + row;
      int32_t* pos = a.state->pos.data() + row;
      for (int64_t s = before; s < n; ++s) {
        pos[s] = int32_t(a.seen_before[b] + (s - before));
        acc[s] = 0.f;
      }
      if (a.seg.key_scores) {
        for (int64_t g = 0; g < group; ++g) {
          const float* p = a.seg.key_scores + ((b * c.n_heads) + h * group + g) * cap;
          for (int64_t s = 0; s < n; ++s) acc[s] += p[s];
        }
      }
      int32_t lo = int32_t(before), hi = int32_t(n);
      if (keep_n < n) {
        // The salt names the (layer, head) only: a sequence's choices must not depend on its
        // place in the batch (positions already differ between sequences).
        const uint64_t salt = a.salt * 0x9e3779b97f4a7c15ull + uint64_t(h);
        if (a.seg.window > 0) {
          window_victims(a, b, h, acc, pos, n, keep_n, salt, scratch, victims);
        } else {
          SlotView view{{acc, size_t(n)}, {pos, size_t(n)}, salt};
          a.policy->select_victims(view, a.budgets[b], keep_n, victims);
        }
        make_keep_list(n, victims, a.prefill ? Compaction::kStable : Compaction::kMoveLast, keep);
        lo = int32_t(keep_n);
        hi = 0;
        move(b, h, {keep.data(), size_t(keep_n)});
        auto moved = [&](int64_t i) {
          const int64_t src = keep[size_t(i)];
          if (src == i) return;
          acc[i] = acc[src];
          pos[i] = pos[src];
          lo = std::min(lo, int32_t(i));
          hi = std::max(hi, int32_t(i + 1));
        };
        if (a.prefill) {
          for (int64_t i = 0; i < keep_n; ++i) moved(i);
        } else {  // move-last changes only the victims' slots below keep_n (victims ascend)
          for (const int32_t i : victims) {
            if (i >= keep_n) break;
            moved(i);
          }
        }
        // New rows that stayed where they were written.
        if (before < keep_n) {
          lo = std::min(lo, int32_t(before));
          hi = std::max(hi, int32_t(keep_n));
        }
      }
      (*a.dirty_lo)[size_t(b * kvh + h)] = lo;
      (*a.dirty_hi)[size_t(b * kvh + h)] = std::max(lo, hi);
    }
    a.len_after[b] = int32_t(keep_n);
  };
  auto range = [&](int64_t b0, int64_t b1) {
    std::vector<int32_t> victims, keep;
    WindowScratch scratch;
    for (int64_t b = b0; b < b1; ++b) decide(b, victims, keep, scratch);
  };
  if (kv_decision_parallelism(a.seg.n_seq, kvh, scap) < 2) return range(0, a.seg.n_seq);
  // Isolated: while it waits, the calling queue thread takes none of another queue's tasks (the
  // CPU device's matrix products), which would hold it long after its own work is done.
  tbb::this_task_arena::isolate([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, a.seg.n_seq, 1),
                      [&](const tbb::blocked_range<int64_t>& r) { range(r.begin(), r.end()); });
  });
}

int64_t kv_decision_parallelism(int64_t n_seq, int64_t kv_heads, int64_t slots) {
  return n_seq < 2 || n_seq * kv_heads * slots < (int64_t(1) << 15) ? 1 : n_seq;
}

void apply_kv_policy(const EvictArgs& a) {
  const int64_t kvh = a.config->n_kv_heads, cap = a.seg.capacity;
  const size_t row = row_nbytes(a.seg.dtype, a.config->head_dim);  // whole Q4 records move
  decide_kv_policy(a, [&](int64_t b, int64_t h, std::span<const int32_t> keep) {
    std::byte* k = static_cast<std::byte*>(a.seg.k) + size_t((b * kvh + h) * cap) * row;
    std::byte* v = static_cast<std::byte*>(a.seg.v) + size_t((b * kvh + h) * cap) * row;
    for (size_t i = 0; i < keep.size(); ++i) {
      const size_t src = size_t(keep[i]);
      if (src == i) continue;
      std::memcpy(k + i * row, k + src * row, row);
      std::memcpy(v + i * row, v + src * row, row);
    }
  });
}

}  // namespace flexh2o
