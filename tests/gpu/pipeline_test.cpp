// Pipeline stages and groups in flight on the CUDA device (label gpu; skipped without one): each
// stage an OffloadEngine on its own CudaDevice over a Model::stage() view, threads over
// LocalChannels, two groups in flight whose batches differ in shape (the first fewer and longer
// rows, the second more and shorter ones), so one device's compute scratch serves both in turn.
// Every step's logits, teacher-forced, stay within f16 tolerance of the CPU device running each
// batch alone in one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "dist/pipeline.h"
#include "engine/bible_requests.h"
#include "engine/cpu_device.h"
#include "engine/forward.h"
#include "engine/offload_engine.h"
#include "engine/policy_of.h"
#include "engine/runner_compare.h"
#include "gpu/cuda_device.h"
#include "gpu/skip_without_gpu.h"
#include "planner/pipeline.h"
#include "dist/stage_threads.h"

namespace flexh2o::test {
namespace {

// As run_forced, for a GroupRunner: batch g goes to group g, all in flight at once, each fed its
// prompt and then want[g]'s tokens; returns each batch's logits.
std::vector<Run> run_forced_groups(GroupRunner& r, const std::vector<std::vector<GenerationRequest>>& batches,
                                   const std::vector<Run>& want) {
  const size_t G = batches.size();
  std::vector<std::vector<int32_t>> real(G);
  std::vector<int64_t> gen(G);
  std::vector<Run> out(G);
  for (size_t g = 0; g < G; ++g) {
    const PaddedPrompts p = pad_prompts(batches[g]);
    gen[g] = int64_t(want[g].tokens.at(0).size());
    real[g] = p.real;
    r.begin_batch(int(g), p.B, p.S + gen[g]);
    r.submit(int(g), p.ids.data(), p.pos.data(), p.S, real[g].data());
  }
  size_t open = G;
  std::vector<float> logits;
  while (open > 0) {
    const size_t g = size_t(r.collect(logits));
    out[g].logits.push_back(logits);
    const int64_t j = int64_t(out[g].logits.size()) - 1;  // decode steps done
    if (j + 1 >= gen[g]) {
      --open;
      continue;
    }
    const size_t B = real[g].size();
    std::vector<int32_t> next(B), np(B);
    for (size_t b = 0; b < B; ++b) {
      next[b] = want[g].tokens[b][size_t(j)];
      np[b] = real[g][b] + int32_t(j);
    }
    r.submit(int(g), next.data(), np.data(), 1, nullptr);
  }
  for (size_t g = 0; g < G; ++g) out[g].tokens = want[g].tokens;
  return out;
}

struct GpuPipelineCase {
  const char* model;
  int stages;
  const char* percent;  // every stage's placement
  bool cpu_attention = false, h2o = false;
};

void PrintTo(const GpuPipelineCase& c, std::ostream* os) {
  *os << c.model << " S" << c.stages << " [" << c.percent << "]" << (c.cpu_attention ? " cpu-attn" : "")
      << (c.h2o ? " h2o" : "");
}

class GpuPipeline : public SkipWithoutGpu<::testing::TestWithParam<GpuPipelineCase>> {};

TEST_P(GpuPipeline, GroupsOfDifferentShapesWithinF16ToleranceOfTheCpu) {
  const GpuPipelineCase& c = GetParam();
  const Model whole = Model::load_dir(model_dir(c.model));
  // Group 0: the 2 longest prompts; group 1: the 2 shortest twice, so group 1 has more
  // sequences but fewer rows.
  auto reqs = bible_requests(c.model, 5);
  ASSERT_EQ(reqs.size(), 4u);
  std::sort(reqs.begin(), reqs.end(),
            [](const auto& a, const auto& b) { return a.prompt_ids.size() > b.prompt_ids.size(); });
  const std::vector<std::vector<GenerationRequest>> batches = {{reqs[0], reqs[1]},
                                                               {reqs[2], reqs[3], reqs[2], reqs[3]}};
  ASSERT_LT(4 * reqs[2].prompt_ids.size(), 2 * reqs[1].prompt_ids.size()) << "the batches no longer differ so";

  std::vector<test::Run> want;
  for (const auto& b : batches) {
    CpuDevice cpu(1);
    Forward fwd(whole, cpu);
    auto kv = c.h2o ? h2o_policy(3, 3) : nullptr;
    InMemoryRunner ref(fwd, 4, kv.get());
    const test::Run greedy = run_greedy(ref, b);
    want.push_back(run_forced(ref, b, greedy.tokens));
  }

  const std::vector<int64_t> bounds = even_bounds(whole.config().n_layers, c.stages);
  struct Stage {
    std::unique_ptr<Model> model;
    std::unique_ptr<Device> dev;
    std::unique_ptr<KvPolicy> kv;
    TempDir dir;
    std::unique_ptr<OffloadEngine> engine;
  };
  std::vector<std::unique_ptr<Stage>> stages;
  for (int s = 0; s < c.stages; ++s) {
    auto st = std::make_unique<Stage>();
    st->model = std::make_unique<Model>(whole.stage(bounds[size_t(s)], bounds[size_t(s) + 1]));
    st->dev = gpu::make_cuda_device({});
    st->kv = c.h2o ? h2o_policy(3, 3) : nullptr;
    OffloadOptions o;
    o.policy = policy_of(c.percent, 4, 1, c.cpu_attention);
    o.kv_policy = st->kv.get();
    o.offload_dir = st->dir.path();
    st->engine = std::make_unique<OffloadEngine>(*st->model, *st->dev, o);
    st->engine->set_groups(2);
    stages.push_back(std::move(st));
  }
  dist::LocalChannels net(c.stages);
  dist::PipelineOptions po;
  po.timeout_s = 60;
  StageThreads servers(net, c.stages, bounds, po, [&](int s) -> OffloadEngine& { return *stages[size_t(s)]->engine; });
  std::vector<test::Run> got;
  {
    dist::PipelineDriver driver(net.channel(0), *stages.back()->engine, c.stages, bounds[size_t(c.stages) - 1], po);
    got = run_forced_groups(driver, batches, want);
    // Twice: the second pass finds both groups' buffers and the device scratch already sized.
    const std::vector<test::Run> again = run_forced_groups(driver, batches, want);
    for (size_t g = 0; g < batches.size(); ++g)
      expect_close_logits(again[g], got[g], 0.25, 0.03, "group " + std::to_string(g) + " again");
    driver.finish(false);
  }
  const std::vector<dist::ServeResult>& served = servers.join();
  for (int rank = 1; rank < c.stages; ++rank) EXPECT_TRUE(served[size_t(rank)].error.empty()) << served[size_t(rank)].error;
  for (size_t g = 0; g < batches.size(); ++g)
    expect_close_logits(got[g], want[g], 0.25, 0.03, "group " + std::to_string(g));
}

INSTANTIATE_TEST_SUITE_P(Stages, GpuPipeline,
                         ::testing::Values(GpuPipelineCase{"tiny-opt", 2, "100 0 100 0 100 0"},
                                           GpuPipelineCase{"tiny-llama", 2, "100 0 100 0 100 0", false, true},
                                           GpuPipelineCase{"tiny-opt", 3, "0 100 0 100 0 100", true, true}));

}  // namespace
}  // namespace flexh2o::test
