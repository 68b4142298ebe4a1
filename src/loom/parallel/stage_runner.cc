#include "loom/parallel/stage_runner.h"

#include <algorithm>

#include "loom/core/check.h"
#include "loom/profile/trace.h"

namespace loom::parallel {
namespace {

class WholeModel final : public StageRunner {
 public:
  WholeModel(model::Gpt& model, DataParallel& dp) : model_(model), dp_(dp) {}

  double train_step(const int* tokens, const int* targets, int B, int T, int M,
                    float scale) override {
    const size_t bt = static_cast<size_t>(B) * T;
    double loss_sum = 0;
    for (int a = 0; a < M; ++a) {
      {
        TraceSpan span("forward", "compute");
        loss_sum += dp_.forward(tokens + a * bt, targets + a * bt, B, T);
      }
      TraceSpan span("backward", "compute");
      dp_.backward(scale, a + 1 == M);
    }
    return loss_sum;
  }

  double forward_only(const int* tokens, const int* targets, int B, int T, float* losses) override {
    const double loss = dp_.forward(tokens, targets, B, T);
    if (losses) std::copy_n(model_.losses(), static_cast<size_t>(B) * T, losses);
    return loss;
  }

  bool computes_loss() const override { return true; }

 private:
  model::Gpt& model_;
  DataParallel& dp_;
};

class Pipelined final : public StageRunner {
 public:
  Pipelined(PipelineStage& stage, DataParallel& dp) : stage_(stage), dp_(dp) {}

  double train_step(const int* tokens, const int* targets, int B, int T, int M,
                    float scale) override {
    LOOM_CHECK_EQ(M, stage_.microbatches());  // the schedule was made for M
    return stage_.train_step(tokens, targets, B, T, scale, &dp_);
  }

  double forward_only(const int* tokens, const int* targets, int B, int T, float* losses) override {
    return stage_.forward_only(tokens, targets, B, T, 1, &dp_, losses);
  }

  bool computes_loss() const override { return stage_.last(); }

 private:
  PipelineStage& stage_;
  DataParallel& dp_;
};

}  // namespace

std::unique_ptr<StageRunner> make_stage_runner(model::Gpt& model, DataParallel& dp,
                                               PipelineStage* stage) {
  if (stage) return std::make_unique<Pipelined>(*stage, dp);
  return std::make_unique<WholeModel>(model, dp);
}

}  // namespace loom::parallel
