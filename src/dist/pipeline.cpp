// The pipeline protocol: one tag, messages in stage order along the chain driver -> stage 0 ->
// ... -> stage S-2 -> driver. Begin (a group's new batch), Step (a group's token step: its inputs
// and, after stage 0, the previous stage's hidden rows), Error (a stage failed; passed on to the
// driver), Stop (a stage's stop flag; passed on to the driver, which stops generating), End
// (passed along the chain, each stage adding its figures, back to the driver).
#include "dist/pipeline.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <sstream>

namespace flexh2o::dist {

namespace {

constexpr int kTag = 20;  // every message of the protocol (data parallel uses 1-8)
enum Kind : uint8_t { kBegin = 1, kStep = 2, kEnd = 3, kError = 4, kStop = 5 };
constexpr double kStopPoll_s = 0.05;  // a stage waiting for a message looks at its stop flag this often

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void put_stats(Writer& w, const StageStats& s) {
  w.put<int32_t>(s.stage).put<int32_t>(s.rank).put_string(s.host).put(s.first_layer).put(s.end_layer).put(s.steps);
  w.put(s.busy_s).put(s.wall_s).put(s.bytes_in).put(s.bytes_out).put(s.peak_kv_bytes);
}

StageStats get_stats(Reader& r) {
  StageStats s;
  s.stage = r.get<int32_t>();
  s.rank = r.get<int32_t>();
  s.host = r.get_string();
  s.first_layer = r.get<int64_t>();
  s.end_layer = r.get<int64_t>();
  s.steps = r.get<int64_t>();
  s.busy_s = r.get<double>();
  s.wall_s = r.get<double>();
  s.bytes_in = r.get<uint64_t>();
  s.bytes_out = r.get<uint64_t>();
  s.peak_kv_bytes = r.get<uint64_t>();
  return s;
}

// A Step message's fields.
struct StepMsg {
  int32_t g = 0;
  int64_t T = 0, B = 0;
  bool has_rows = false;
  std::vector<int32_t> ids, pos, real_rows;
  std::span<const std::byte> hidden;
};

std::vector<std::byte> step_message(int32_t g, int64_t T, int64_t B, std::span<const int32_t> ids,
                                    std::span<const int32_t> pos, const int32_t* real_rows,
                                    std::span<const std::byte> hidden) {
  Writer w;
  w.put<uint8_t>(kStep).put(g).put(T).put(B).put<uint8_t>(real_rows != nullptr);
  w.put_array(ids).put_array(pos);
  w.put_array(std::span<const int32_t>(real_rows, real_rows ? size_t(B) : 0));
  w.put_bytes(hidden);
  return w.take();
}

StepMsg read_step(Reader& r) {
  StepMsg s;
  s.g = r.get<int32_t>();
  s.T = r.get<int64_t>();
  s.B = r.get<int64_t>();
  s.has_rows = r.get<uint8_t>() != 0;
  s.ids = r.get_array<int32_t>();
  s.pos = r.get_array<int32_t>();
  s.real_rows = r.get_array<int32_t>();
  s.hidden = r.get_bytes();
  if (s.T <= 0 || s.B <= 0 || int64_t(s.ids.size()) != s.B * s.T || s.pos.size() != s.ids.size() ||
      (s.has_rows && int64_t(s.real_rows.size()) != s.B))
    FH_FAIL("a pipeline step message of ", s.B, " x ", s.T, " rows holds ", s.ids.size(), " ids and ", s.pos.size(),
            " positions: the ranks do not run the same flexh2o");
  return s;
}

std::vector<std::byte> error_message(int stage, const std::string& what) {
  Writer w;
  w.put<uint8_t>(kError).put<int32_t>(stage).put_string(what);
  return w.take();
}

std::vector<std::byte> stop_message(int stage, int signal) {
  Writer w;
  w.put<uint8_t>(kStop).put<int32_t>(stage).put<int32_t>(signal);
  return w.take();
}

std::string seconds(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

bool stop_set(const PipelineOptions& o) { return o.stop && o.stop->load(); }
int signal_of(const PipelineOptions& o) { return o.signal ? o.signal->load() : 0; }

}  // namespace

int stage_rank(int stage, int stages) { return (stage + 1) % stages; }
int rank_stage(int rank, int stages) { return (rank + stages - 1) % stages; }

double PipelineReport::bubble() const {
  double busy = 0, wall = 0;
  for (const StageStats& s : stages) busy += s.busy_s, wall += s.wall_s;
  return wall > 0 ? 1 - busy / wall : 0;
}

uint64_t PipelineReport::peak_kv_bytes() const {
  uint64_t n = 0;
  for (const StageStats& s : stages) n += s.peak_kv_bytes;
  return n;
}

void StageStats::note_kv(int group, uint64_t bytes) {
  if (group_kv.size() <= size_t(group)) group_kv.resize(size_t(group) + 1);
  group_kv[size_t(group)] = bytes;
  peak_kv_bytes = std::max(peak_kv_bytes, std::accumulate(group_kv.begin(), group_kv.end(), uint64_t(0)));
}

uint64_t PipelineReport::bytes_between_stages() const {
  uint64_t n = 0;
  for (const StageStats& s : stages) n += s.bytes_out;
  return n;
}

// ---- the driver (rank 0, last stage) -------------------------------------------------------

PipelineDriver::PipelineDriver(Channel& ch, OffloadEngine& last, int stages, int64_t first_layer,
                               const PipelineOptions& o)
    : ch_(ch), last_(last), stages_(stages), opts_(o) {
  FH_CHECK(stages >= 2 && ch.size() == stages && ch.rank() == 0, "a pipeline of ", stages, " stages on rank ",
           ch.rank(), " of ", ch.size());
  own_.stage = stages - 1;
  own_.rank = 0;
  own_.host = ch.describe(0);
  own_.first_layer = first_layer;
  own_.end_layer = first_layer + last.config().n_layers;
  batch_of_.assign(size_t(last.groups()), 0);
  t0_ = now_s();
}

PipelineDriver::~PipelineDriver() {
  if (finished_ || broken_) return;
  try {
    (void)finish(true);
  } catch (...) {  // the caller is already failing; the stages end by their timeout
  }
}

// After a stop the steps still in flight are waited for only a little longer than the longest
// wait for a decode step before it (prefills and the stages' start are not the measure): under
// mpirun a signal often means a rank died (mpirun then SIGTERMs the others and kills them 1 s
// later), and a step that does not come back must end the job while it can still say so. A wait
// looks at the stop flag every kStopPoll_s, so a stop during a wait counts from when it came.
Status PipelineDriver::wait(Message* m, bool decode) {
  const int from = stage_rank(stages_ - 2, stages_);
  const double t0 = now_s();
  const bool stopped_before = stop_.load();
  auto grace = [&] { return stop_grace_s(longest_wait_s_, opts_.timeout_s); };
  double deadline = t0 + (stopped_before ? grace() : opts_.timeout_s);
  bool stopped = stopped_before;
  while (true) {
    refresh_stop();
    if (stop_.load() && !stopped) {
      stopped = true;
      deadline = std::min(deadline, now_s() + grace());
    }
    const double left = std::max(0.0, deadline - now_s());
    Status s = ch_.recv(from, kTag, opts_.stop && !stopped ? std::min(left, kStopPoll_s) : left, m);
    if (s.ok()) {
      if (decode && !stopped) longest_wait_s_ = std::max(longest_wait_s_, now_s() - t0);
      return s;
    }
    if (now_s() < deadline) continue;
    if (stopped)
      return {StatusCode::kIoError, "no step came back within " + seconds(grace()) + " of the stop (signal " +
                                        std::to_string(stop_signal_) + "): a rank is gone or hangs"};
    if (!opts_.stop) return s;
    return {StatusCode::kIoError, "no message from " + ch_.describe(from) + " in " + seconds(opts_.timeout_s)};
  }
}

void PipelineDriver::refresh_stop() {
  if (!stop_.load() && stop_set(opts_)) note_stop(signal_of(opts_));
}

void PipelineDriver::note_stop(int signal) {
  if (stop_.load()) return;
  stop_signal_ = signal;
  stop_.store(true);
  if (opts_.on_stop) opts_.on_stop(signal);
}

void PipelineDriver::begin_batch(int g, int64_t B, int64_t capacity) {
  FH_CHECK(g >= 0 && g < groups(), "group ", g, " outside [0, ", groups(), ")");
  Writer w;
  w.put<uint8_t>(kBegin).put<int32_t>(g).put(B).put(capacity);
  ch_.send(stage_rank(0, stages_), kTag, w.take());
  refresh_stop();
  last_.select_group(g);
  last_.begin_batch(B, capacity);
  batch_of_[size_t(g)] = B;
}

void PipelineDriver::submit(int g, const int32_t* ids, const int32_t* positions, int64_t T, const int32_t* real_rows) {
  Pending p;
  p.g = g;
  p.T = T;
  p.B = batch_of_.at(size_t(g));
  FH_CHECK(p.B > 0, "submit to group ", g, " before begin_batch");
  p.ids.assign(ids, ids + p.B * T);
  p.pos.assign(positions, positions + p.B * T);
  if (real_rows) p.real_rows.assign(real_rows, real_rows + p.B);
  std::vector<std::byte> m = step_message(g, T, p.B, p.ids, p.pos, real_rows, {});
  own_.bytes_out += m.size();
  ch_.send(stage_rank(0, stages_), kTag, std::move(m));
  pending_.push_back(std::move(p));
}

int PipelineDriver::collect(std::vector<float>& logits) {
  FH_CHECK(!pending_.empty(), "collect() with no step in flight");
  const Pending p = std::move(pending_.front());
  pending_.pop_front();
  refresh_stop();
  Message m;
  uint8_t kind = 0;
  std::optional<Reader> reader;
  while (true) {  // a stage's stop request comes between steps
    if (Status s = wait(&m, p.T == 1); !s.ok()) {
      broken_ = true;
      FH_FAIL("the pipeline stopped: ", s.message());
    }
    own_.bytes_in += m.bytes.size();
    reader.emplace(m.bytes, "a pipeline message");
    kind = reader->get<uint8_t>();
    if (kind != kStop) break;
    (void)reader->get<int32_t>();
    note_stop(reader->get<int32_t>());
  }
  Reader& r = *reader;
  refresh_stop();
  if (kind == kError) {
    const int stage = r.get<int32_t>();
    const std::string what = r.get_string();
    FH_FAIL("pipeline stage ", stage, " (", ch_.describe(stage_rank(stage, stages_)), ") failed: ", what);
  }
  FH_CHECK(kind == kStep, "pipeline message of kind ", int(kind), " where a step was expected");
  const StepMsg s = read_step(r);
  FH_CHECK(s.g == p.g && s.T == p.T && s.B == p.B, "pipeline steps out of order: got group ", s.g, " (", s.B, " x ",
           s.T, "), expected group ", p.g, " (", p.B, " x ", p.T, ")");
  const double t = now_s();
  last_.select_group(p.g);
  last_.step_stage(p.ids.data(), p.pos.data(), p.T, p.real_rows.empty() ? nullptr : p.real_rows.data(), s.hidden,
                   nullptr, logits);
  own_.busy_s += now_s() - t;
  ++own_.steps;
  own_.note_kv(p.g, last_.kv_bytes());
  return p.g;
}

PipelineReport end_stages(Channel& ch, int stages, bool failed, const PipelineOptions& o, int signal) {
  Writer w;
  w.put<uint8_t>(kEnd).put<uint8_t>(failed).put<int32_t>(signal).put<int32_t>(0);
  ch.send(stage_rank(0, stages), kTag, w.take());
  PipelineReport rep;
  while (true) {  // in-flight steps and errors before the end are dropped
    Message m;
    if (Status s = ch.recv(stage_rank(stages - 2, stages), kTag, o.timeout_s, &m); !s.ok())
      FH_FAIL("the pipeline did not end in order: ", s.message());
    Reader r(m.bytes, "a pipeline message");
    if (r.get<uint8_t>() != kEnd) continue;
    (void)r.get<uint8_t>();
    (void)r.get<int32_t>();
    const int32_t n = r.get<int32_t>();
    for (int32_t i = 0; i < n; ++i) rep.stages.push_back(get_stats(r));
    return rep;
  }
}

PipelineReport PipelineDriver::finish(bool failed, int signal) {
  FH_CHECK(!finished_ && !broken_, "finish() once, on a pipeline that is not broken");
  finished_ = true;
  PipelineReport rep;
  try {
    rep = end_stages(ch_, stages_, failed, opts_, signal);
  } catch (const Error&) {
    broken_ = true;
    throw;
  }
  own_.wall_s = now_s() - t0_;
  rep.stages.push_back(own_);
  std::sort(rep.stages.begin(), rep.stages.end(), [](const StageStats& a, const StageStats& b) { return a.stage < b.stage; });
  return rep;
}

// ---- a stage before the last (ranks 1..S-1) -------------------------------------------------

ServeResult serve_stage(Channel& ch, OffloadEngine& engine, int stages, int64_t first_layer, const PipelineOptions& o) {
  const int me = ch.rank(), s = rank_stage(me, stages);
  FH_CHECK(stages >= 2 && ch.size() == stages && me != 0, "stage server on rank ", me, " of ", ch.size());
  const int prev = s == 0 ? 0 : stage_rank(s - 1, stages), next = stage_rank(s + 1, stages);
  StageStats st;
  st.stage = s;
  st.rank = me;
  st.host = ch.describe(me);
  st.first_layer = first_layer;
  st.end_layer = first_layer + engine.config().n_layers;
  ServeResult res;
  bool failed = false;
  auto fail = [&](const std::exception& e) {
    failed = true;
    res.error = e.what();
    ch.send(next, kTag, error_message(s, e.what()));
  };
  bool asked_stop = false;
  // The next message; while none comes, the stop flag is looked at every kStopPoll_s.
  auto next_message = [&](Message* m) {
    const double t_end = now_s() + o.timeout_s;
    while (true) {
      if (!asked_stop && stop_set(o)) {
        asked_stop = true;
        ch.send(next, kTag, stop_message(s, signal_of(o)));
      }
      const double left = t_end - now_s();
      const Status w = ch.recv(prev, kTag, o.stop && !asked_stop ? std::min(left, kStopPoll_s) : left, m);
      if (w.ok()) return;
      if (now_s() < t_end) continue;
      if (!o.stop) FH_FAIL("pipeline stage ", s, " (", ch.describe(me), ") stopped: ", w.message());
      // The last slice's own message would name the slice, not the whole wait.
      FH_FAIL("pipeline stage ", s, " (", ch.describe(me), ") stopped: no message from ", ch.describe(prev), " in ",
              o.timeout_s, " s");
    }
  };
  double t0 = 0;
  std::vector<std::byte> out;
  std::vector<float> logits;
  while (true) {
    Message m;
    next_message(&m);
    if (t0 == 0) t0 = now_s();
    Reader r(m.bytes, "a pipeline message");
    const uint8_t kind = r.get<uint8_t>();
    if (kind == kBegin) {
      const int32_t g = r.get<int32_t>();
      const int64_t B = r.get<int64_t>(), cap = r.get<int64_t>();
      if (next != 0) ch.send(next, kTag, std::move(m.bytes));
      if (failed) continue;
      try {
        // The block is each rank's own -b/--gpu-batch-size/--num-gpu-batches; rank 0's sets B.
        if (B > engine.max_batch())
          FH_FAIL("rank 0 runs batches of ", B, " sequences and this stage's block holds ", engine.max_batch(),
                  " (its -b, --gpu-batch-size or --num-gpu-batches differ from rank 0's); give every rank the "
                  "same flags");
        engine.select_group(g);
        engine.begin_batch(B, cap);
      } catch (const std::exception& e) {
        fail(e);
      }
    } else if (kind == kStep) {
      st.bytes_in += m.bytes.size();
      if (failed) continue;
      try {
        const StepMsg x = read_step(r);
        const double t = now_s();
        engine.select_group(x.g);
        engine.step_stage(x.ids.data(), x.pos.data(), x.T, x.has_rows ? x.real_rows.data() : nullptr, x.hidden, &out,
                          logits);
        st.busy_s += now_s() - t;
        ++st.steps;
        st.note_kv(x.g, engine.kv_bytes());
        std::vector<std::byte> fwd = step_message(x.g, x.T, x.B, x.ids, x.pos, x.has_rows ? x.real_rows.data() : nullptr, out);
        st.bytes_out += fwd.size();
        ch.send(next, kTag, std::move(fwd));
      } catch (const std::exception& e) {
        fail(e);
      }
    } else if (kind == kError || kind == kStop) {
      ch.send(next, kTag, std::move(m.bytes));
    } else if (kind == kEnd) {
      const bool job_failed = r.get<uint8_t>() != 0;
      const int32_t signal = r.get<int32_t>();
      const int32_t n = r.get<int32_t>();
      std::vector<StageStats> before;
      for (int32_t i = 0; i < n; ++i) before.push_back(get_stats(r));
      st.wall_s = now_s() - t0;
      Writer w;
      w.put<uint8_t>(kEnd).put<uint8_t>(job_failed || failed).put<int32_t>(signal).put<int32_t>(n + 1);
      for (const StageStats& b : before) put_stats(w, b);
      put_stats(w, st);
      ch.send(next, kTag, w.take());
      res.job_failed = job_failed || failed;
      res.stop_signal = signal;
      return res;
    } else {
      FH_FAIL("pipeline message of kind ", int(kind), ": the ranks do not run the same flexh2o");
    }
  }
}

}  // namespace flexh2o::dist
