// The GPT-2 model on the CPU kernels: token + position embeddings, pre-LayerNorm blocks
// (causal multi-head attention, GELU MLP), final LayerNorm, LM head tied to the token
// embedding, vocabulary padded (padded logits excluded from the loss). ZeRO and pipeline
// parallelism act on the units from outside through bind_unit() and UnitHooks (DESIGN
// decision 4); tensor parallelism changes the model's shapes and inserts the conjugate
// communication of model/tp_comm.h, through an interface, never a communicator.
//
// Units (DESIGN decision 5): parameters live in one flat layout in which each unit is a
// contiguous slice — unit 0 the embeddings (wte (Vp,C), wpe (maxT,C)), units 1..L the blocks,
// unit L+1 the final LayerNorm. Gradients mirror that layout. Inside a block:
//   ln1w ln1b (C) | qkvw (3,C,C) qkvb (3,C) | attprojw (C,C) attprojb (C) | ln2w ln2b (C)
//   | fcw (4C,C) fcb (4C) | fcprojw (C,4C) fcprojb (C)
// (qkvw is q, k and v's (C,C) matrices stacked: the (3C,C) of GPT-2's c_attn.)
//
// Tensor parallelism (TensorSplit, t ranks; Megatron-LM's layout): a rank holds heads
// [r*NH/t, (r+1)*NH/t): qkvw (3,C/t,C) and fcw (4C/t,C) are column-parallel (rows split),
// attprojw (C,C/t) and fcprojw (C,4C/t) row-parallel (columns split, bias added once after
// the reduction), wte (Vp/t,C) vocab-parallel (the embedding lookup summed over the group,
// logits (N,Vp/t) and a vocab-parallel cross-entropy that never gathers them). LayerNorms,
// wpe and the row-parallel biases are replicated. With sequence parallelism the LayerNorm
// and residual regions hold only this rank's N/t token rows (N = B*T, rows split in order:
// with B = 1 exactly Megatron's split of the sequence) — allgather before a column-parallel
// linear, reduce-scatter after a row-parallel one — and the replicated LayerNorm gradients,
// then partial, are summed over the group. Every tensor records the box of the whole tensor
// it holds, so checkpoints name whole tensors whatever the split.
//
// Memory: each block keeps what its backward reads (ln1, qkv, att, atty, res2, ln2, fch,
// gelu(fch) and the LayerNorm statistics) unless it is recomputed, in which case it keeps
// only its input on the residual stream and backward runs its forward again into one
// shared block's worth of buffers. Gradients of activations use one block's worth of
// scratch, whatever the depth. The logits buffer is turned into logit gradients in place
// (through probabilities, under tensor parallelism).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/box.h"
#include "loom/core/state_memory.h"
#include "loom/kernels/backend.h"
#include "loom/model/tp_comm.h"
#include "loom/profile/trace.h"

namespace loom::model {

struct GptConfig {
  std::string name = "custom";
  int n_layer = 2, n_head = 2, n_embd = 64, block_size = 64;
  int vocab_size = 50257, padded_vocab_size = 50304;  // padded to a multiple of 128
  // tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m; UserError otherwise.
  static GptConfig named(const std::string& name);
  // This shape with the given fields changed (0: kept; the vocabulary padded to a multiple
  // of 128). A changed shape is a model of its own, named "custom <n_layer>x<n_embd>", never
  // after the model it started from. Not validated.
  GptConfig reshaped(int layers, int hidden, int heads, int vocab, int context) const;
  void validate() const;  // UserError naming the field
  // UserError naming the numbers when the model cannot be split t ways (heads, padded
  // vocabulary).
  void validate_split(int t) const;
  // Model FLOPs of one token's forward + backward at sequence length T: 6 x parameters
  // that enter matrix products (all but the position embeddings; the tied head counts
  // once) + 12 x layers x C x T for attention's two products. (docs/perf.md: MFU.)
  double flops_per_token(int T) const;
  // As stored in checkpoints: {"name", "n_layer", ..., "padded_vocab_size"}.
  nlohmann::json to_json() const;
  static GptConfig from_json(const nlohmann::json& j);  // validated
};

// A buffer of floats in the backend's memory (kernels/memory.h): every activation and
// scratch buffer of the model.
using Floats = kernels::Buffer<float>;

struct Tensor {  // one named parameter tensor inside this rank's flat layout
  std::string name;
  Shape shape;          // the whole tensor's
  Shape start, extent;  // the box of it this rank holds (all of it without tensor parallelism)
  size_t offset, size;  // in the flat layout; size = the box's element count
  int unit;
  bool decay;       // weight decay applies (matrices and embeddings, not biases or norms)
  bool replicated;  // every tensor-parallel rank holds the whole tensor
};

// Called by the model around each use of a unit's parameters and when a unit's gradients
// are final for this backward pass. Forward uses units 0, 1..L, L+1, then 0 again (the
// tied head); backward uses 0 (head), L+1, L..1 (each recomputed block once more), 0.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_use(int /*unit*/) {}
  virtual void after_use(int /*unit*/) {}
  virtual void grads_ready(int /*unit*/) {}
};

// Which part of a backward pass to run. Zero-bubble pipeline schedules split it
// (parallel/pipeline_schedule.h: B on the critical path, W later, into the bubbles).
enum class BackwardPart {
  kWhole,   // input and weight gradients together (BW)
  kInput,   // input gradients only; what the weight gradients need is kept (B)
  kWeight,  // the weight gradients an earlier kInput left (W)
};

// The head split (pipeline parallelism, pp.head_split): the head and loss of a microbatch's
// first `rows` rows run on another stage (Gpt::head_share there), the rest in this run.
struct HeadShare {
  int rows = 0;
  // Forward: called with those rows of the final norm's output (rows, C), before this run's
  // own rows of the head (to send them on).
  std::function<void(const float*)> norm_ready;
  // Backward (B or BW): their input gradient (rows, C), asked for after this run's own rows of
  // the head and before the final norm's backward (to receive it).
  std::function<const float*()> input_grad;
};

// What one microbatch's forward through a run of units keeps for that run's backward:
// block inputs on the residual stream, each block's activations (none for a recomputed
// block), the final norm, logits and losses; between a kInput and a kWeight backward, the
// output gradients the weight gradients need. A pipeline keeps one per microbatch in
// flight; Gpt::forward() uses one of its own.
class Activations {
 public:
  size_t bytes() const;  // all of it
  // What the blocks keep for backward: each block's input on the residual stream and its
  // activations (Korthikanti et al.'s per-layer activation memory, summed over the blocks).
  size_t block_bytes() const;
  // The buffers a forward leaves for the backward (an offloader may write them out and free
  // them while the microbatch waits, then restore them before the backward).
  std::vector<Floats*> buffers();

  struct Block {  // what one block's backward reads
    Floats ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
    size_t floats() const;
  };
  // Output gradients of the block's matrix products, from B for W (the LayerNorms' weight
  // gradients are computed in B, where their inputs are in cache).
  struct BlockGrads {
    Floats mlp_out, fch, attn_out, qkv;
    size_t floats() const;
  };

 private:
  friend class Gpt;
  int B = 0, T = 0, first = 0, last = -1, recompute_every = -1;
  kernels::Buffer<int> tokens, targets;
  bool have_targets = false;
  bool weights_pending = false;   // a kInput ran, its kWeight not yet
  int head_from = 0;              // the first row of the head this run computes (HeadShare)
  std::vector<Floats> resid;      // input of each block of the run, then its output
  std::vector<Block> blocks;      // per block of the run
  std::vector<BlockGrads> grads;  // per block of the run, kInput to kWeight
  Floats lnf, lnf_mean, lnf_rstd, lnf_all, logits, losses;
  Floats loss_max, loss_sum, loss_target;  // vocab-parallel loss, per row
  Floats d_embed;                          // kInput to kWeight: the embedding's output gradient
  Floats input_grad;  // the run's input gradient (R,C) when it has no embedding
};

class Gpt {
 public:
  // With own_storage the model allocates the flat parameter and gradient buffers and binds
  // every unit into them; without, the caller binds every unit before use (ZeRO-3).
  // With split.size > 1, set_tp_comm() must be called before forward(). Without
  // with_grads (inference: `loom sample`) no gradient buffer is allocated; backward() must
  // not be called.
  explicit Gpt(GptConfig cfg, bool own_storage = true, TensorSplit split = {},
               bool with_grads = true);
  const GptConfig& config() const { return cfg_; }
  const TensorSplit& split() const { return split_; }
  void set_tp_comm(TpComm* comm) { tp_comm_ = comm; }
  size_t num_params() const { return total_; }
  // The owned flat buffers (own_storage only).
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // [begin, end) offsets of unit u's slice in the flat layout.
  std::pair<size_t, size_t> unit_range(int u) const { return units_[u]; }
  int num_units() const { return static_cast<int>(units_.size()); }
  // Points unit u at params/grads holding its slice (unit_range(u) sizes).
  void bind_unit(int u, float* params, float* grads);
  // A block's 12 tensors, in the order of its slice of the flat layout (above).
  enum BlockTensor {
    kLn1w,
    kLn1b,
    kQkvw,
    kQkvb,
    kProjw,
    kProjb,
    kLn2w,
    kLn2b,
    kFcw,
    kFcb,
    kFcProjw,
    kFcProjb,
    kBlockTensors
  };
  // This rank's part of block l's tensor t, and of the tensor named `name` (tensors()), in
  // the unit buffers bound now.
  const float* block_param(int l, BlockTensor t) const {
    return unit_params_[l + 1] + block_offsets_[t];
  }
  const float* param(const std::string& name) const;
  void set_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  // Where wte's fp32 values are not in memory (zero.offload_master on a rank that looks
  // tokens up): the lookup asks `rows` for the distinct rows a microbatch reads, ids sorted,
  // (n, C) into `out`, and adds them as it would have from wte itself (the same sums).
  // Without tensor parallelism only; empty: wte is read where it is bound.
  using RowSource = std::function<void(const int* ids, size_t n, float* out)>;
  void set_lookup_rows(RowSource rows);
  // Recompute policy: 0 keeps every block's activations, k >= 1 recomputes blocks
  // 0, k, 2k, ... (1 = all).
  void set_recompute_every(int k) { recompute_every_ = k; }
  // The kernels the model runs on (kernels/backend.h): the optimised CPU backend unless
  // replaced (train.backend); it keeps the precision set before or after.
  void set_backend(std::unique_ptr<kernels::Backend> b);
  kernels::Backend& backend() const { return *backend_; }
  void set_precision(kernels::Precision p) { backend_->set_precision(p); }
  // Under native bf16 products the model keeps a bf16 copy of each unit's parameters, made
  // when the unit's forward starts and read by that forward's products and by its
  // backward's (which runs on the same parameters): one rounding of a weight per forward
  // instead of one per product. Costs 2 bytes per parameter of the units between forward
  // and backward: off under ZeRO-3, whose point is not to hold every unit.
  void set_bf16_weight_copies(bool on) { bf16_copies_ = on; }
  // Master-weight offload (zero.offload_master): the owner of the parameters takes over unit
  // u's bf16 copy (its whole range, allocated on the first call) and keeps it current, written
  // from the master values after every update; the model never rounds that unit itself, and
  // products read the copy whatever the CPU (without bf16 products they widen it: the same
  // numbers). So the fp32 values of the unit's tensors read only through their copies
  // (only_bf16_read) need not be in memory. Other units keep the model's own copies.
  uint16_t* owner_bf16(int u);
  // Whether owner_bf16(u) was called: the owner keeps unit u's copy.
  bool bf16_owned(int u) const { return !owned16_.empty() && owned16_[u]; }
  // Whether products are the only readers of tensor t, through its bf16 copy, under bf16
  // precision: the blocks' four weight matrices (LayerNorm and biases read fp32 values), and
  // the embedding's tensors where this rank does not run the lookup (`lookup` false: a last
  // pipeline stage's copy for the tied head, whose wpe nothing reads).
  bool only_bf16_read(const Tensor& t, bool lookup = true) const;
  // Whether the passes that produce a product's operand (LayerNorm, GELU, attention's softmax,
  // the loss's backward) write its bf16 rounding for the product, and operands two products
  // read are rounded once (on: the default). Off, every product rounds its own operands: the
  // same bits, more passes over memory (the tests' reference).
  void set_bf16_staging(bool on) { backend_->set_staging(on); }

  // GPT-2 initialisation: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0,
  // LayerNorm weights 1, padded vocabulary rows 0. Every value is a pure function of (seed,
  // tensor name, element index in the whole tensor): identical weights under every layout.
  void init(uint64_t seed);  // own_storage only
  // The same values for elements [begin, end) of the flat layout, written to out[0..).
  void init_params(uint64_t seed, size_t begin, size_t end, float* out) const;

  // The whole model on one micro-batch: the mean cross-entropy over B*T positions; keeps
  // what backward() needs. targets may be null (inference: logits() valid, returns 0).
  float forward(const int* tokens, const int* targets, int B, int T);
  // Accumulates scale * d(mean loss)/d(params) into the gradients (callers zero them first;
  // scale = 1/grad_accum averages micro-batches).
  void backward(float scale = 1.0f);
  void zero_grad();
  // (B*T, Vp) logits of the last forward without targets ((B*T, Vp/t): this rank's
  // vocabulary columns, under tensor parallelism).
  const float* logits() const { return acts_.logits.data(); }
  // (B*T) per-position cross-entropies (-log p(target)) of the last forward with targets;
  // their mean is what forward() returned. Of a run ending in the loss: losses(a).
  const float* losses() const { return acts_.losses.data(); }
  static const float* losses(const Activations& a) { return a.losses.data(); }

  // A run of consecutive units [first, last] on one microbatch in `a` (a pipeline stage).
  // It starts from tokens (B,T) when first == 0, else from `input`, this rank's R rows of
  // the residual stream (R = rows(B, T)); it ends in the loss over `targets` (returned;
  // null: inference) when last is the final unit, else its output is left in output(a).
  // The tied head reads unit 0's wte, so a run ending in the loss uses unit 0 too.
  // With `share` (rows > 0; targets given, no tensor parallelism) the head runs over rows
  // [share->rows, N) only and the loss returned is their sum over N.
  float forward_units(Activations& a, int first, int last, const int* tokens, const int* targets,
                      int B, int T, const float* input, const HeadShare* share = nullptr);
  // Its backward in reverse, `part` of it: dout (R,C) is the gradient of the output (unused
  // when the run ended in the loss); the input's gradient is left in input_grad(a) (when
  // first > 0). Gradients accumulate with scale as in backward(); UnitHooks::grads_ready
  // fires for a unit when its weight gradients are done (kWhole, kWeight).
  // A run whose forward had a HeadShare takes the same one here (B, BW: input_grad).
  void backward_units(Activations& a, float scale, const float* dout, BackwardPart part,
                      const HeadShare* share = nullptr);
  // The head split's other half, on the stage holding the tied embedding: the head's forward
  // and backward at once over `rows` rows of an N-row microbatch from ln (rows, C), their
  // final norm's output, and targets (rows). scale * d(mean loss over the N rows)/d(wte)
  // accumulates into wte's gradient (unit 0, used as the head: the hooks run) and the rows'
  // input gradient goes to dln (rows, C). Returns the rows' loss sum over N.
  float head_share(const float* ln, const int* targets, int rows, int N, float scale, float* dln);
  const float* output(const Activations& a) const { return a.resid.back().data(); }
  const float* input_grad(const Activations& a) const { return a.input_grad.data(); }
  // Rows of the residual stream a rank holds for a (B,T) micro-batch.
  int rows(int B, int T) const { return sp_ ? B * T / tp_ : B * T; }

  // Bytes of activation buffers allocated: the model's own forward's and its scratch.
  size_t activation_bytes() const;
  // Of them, what the blocks keep for backward (Activations::block_bytes).
  size_t block_activation_bytes() const { return acts_.block_bytes(); }
  // How many times forward_units (re)sized an Activations for its units and shape: buffers
  // allocated afresh (a reused set of the same units and shape is not counted).
  size_t activation_sizings() const { return sizings_; }

 private:
  using BlockActs = Activations::Block;
  using BlockGrads = Activations::BlockGrads;
  void allocate_scratch(int B, int T);
  void prepare(Activations& a, int first, int last, int B, int T) const;
  bool recomputed(int l) const { return recompute_every_ > 0 && l % recompute_every_ == 0; }
  BlockActs& acts_of(Activations& a, int l) {
    return recomputed(l) ? recompute_acts_ : a.blocks[l - first_block(a)];
  }
  static int first_block(const Activations& a) { return std::max(a.first, 1) - 1; }
  int last_block(const Activations& a) const { return std::min(a.last, cfg_.n_layer) - 1; }
  void block_forward(int l, BlockActs& a, const float* in, float* out);
  // part kWhole or kInput (then `keep` receives the output gradients for the weights).
  void block_backward(int l, BlockActs& a, const float* in, float* dx, BackwardPart part,
                      BlockGrads* keep);
  void block_weight_grads(int l, BlockActs& a, const BlockGrads& kept);
  // A weight matrix for a product: its fp32 values and, where made, its bf16 copy.
  struct Weight {
    const float* f32;
    const uint16_t* bf16;
  };
  Weight weight(int unit, size_t offset) const { return {p(unit, offset), p16(unit, offset)}; }
  const uint16_t* p16(int unit, size_t offset) const;
  void round_unit(int u);  // makes unit u's bf16 copy (when bf16 copies are on)
  void make_copy_slots();  // unit16_ and unit16_from_ sized to the units (empty copies)
  // A B pass's output gradient in `scratch` for its W pass, into `kept` (gpt.cc).
  static void keep_for_weights(Floats& kept, Floats& scratch);
  // A linear's backward: whole, or the input gradient with dout kept for the weights; the
  // input gradient added to dinp, or written over it (assign).
  void linear_backward(BackwardPart part, float* dinp, float* dw, float* db, const float* dout,
                       const float* inp, Weight w, int N, int C, int OC, Floats* keep,
                       const uint16_t* dout16 = nullptr, bool assign = false);
  // The tensor-parallel edges (model/tp_comm.h); identities without tensor parallelism.
  const float* gather_rows(const float* rows, float* all);  // f forward / g backward
  const float* reduce_input_grad(float* partial);           // f backward
  const float* row_parallel_linear(float* partial, const float* inp, Weight w, const float* bias,
                                   int K, const uint16_t* inp16 = nullptr);  // linear + g forward
  uint16_t* input_bf16(size_t n);
  // LayerNorm backward over the R rows: the input gradient and the weight gradients (completed
  // over the tp group under sequence parallelism), in B and BW alike.
  void layernorm_backward_rows(float* dx, float* dw, float* db, const float* dout, const float* inp,
                               const float* w, const float* mean, const float* rstd);
  void embed_forward(Activations& a);
  void embed_weight_grads(const int* tokens, const float* dx);
  // The mean loss's share of rows [from, N) (sum / N).
  float loss_forward(Activations& a, int from = 0);
  // UserError when an id of ids[0, n) is outside the vocabulary.
  void check_token_ids(const int* ids, int n) const;
  // The sum of losses[from, size) read back to the host, over N (the mean loss's share).
  static float loss_share(const Floats& losses, size_t from, int N);
  const float* p(int unit, size_t offset) const { return unit_params_[unit] + offset; }
  float* p(int unit, size_t offset) { return unit_params_[unit] + offset; }
  float* g(int unit, size_t offset) { return unit_grads_[unit] + offset; }
  // Around each use of a unit's parameters (`head`: unit 0 as the tied head): the hooks,
  // and with the timeline on a span "block 3 F" (the unit, the pass) on the compute track.
  void use(int u, bool head = false) {
    if (hooks_) hooks_->before_use(u);
    if (Trace::on()) unit_t0_ = Trace::now_us(), unit_head_ = head;
  }
  void done(int u) {
    if (unit_t0_ >= 0) trace_unit(u);
    if (hooks_) hooks_->after_use(u);
  }
  void trace_unit(int u);
  void ready(int u) {
    if (hooks_) hooks_->grads_ready(u);
  }

  double unit_t0_ = -1;  // the timeline: when the unit in use started, or -1
  bool unit_head_ = false;
  const char* pass_ = "F";
  GptConfig cfg_;
  TensorSplit split_;
  TpComm* tp_comm_ = nullptr;
  // Local sizes: Cl = C/t channels of attention and NHl heads, Vl = Vp/t vocabulary columns
  // from vocab_begin_ (the first vocab_valid_ of them real), N = B*T rows, R = the rows of
  // the LayerNorm/residual region (N/t under sequence parallelism, from row_begin_).
  int tp_ = 1, Cl_ = 0, NHl_ = 0, Vl_ = 0, vocab_begin_ = 0, vocab_valid_ = 0;
  bool sp_ = false;
  int N_ = 0, R_ = 0, row_begin_ = 0;
  size_t total_ = 0;
  StateVector params_, grads_;
  std::vector<Tensor> tensors_;
  std::vector<std::pair<size_t, size_t>> units_;
  std::vector<float*> unit_params_, unit_grads_;
  std::vector<size_t> block_offsets_;  // offset of each of a block's 12 tensors within it
  UnitHooks* hooks_ = nullptr;
  RowSource lookup_rows_;  // set_lookup_rows
  // The lookup's rows when fetched: the distinct ids, their rows, the tokens renumbered.
  std::vector<int> lookup_ids_, lookup_index_;
  std::vector<float> lookup_host_;
  Floats lookup_table_;
  kernels::Buffer<int> lookup_tokens_;
  int recompute_every_ = 0;
  std::unique_ptr<kernels::Backend> backend_;
  bool bf16_copies_ = true;
  std::vector<char> owned16_;  // per unit: its copy is the owner's (owner_bf16)
  // Per unit: its bf16 copy and the fp32 buffer it was made from (a copy is read only
  // while the unit is still bound to that buffer).
  using Copy16 = std::vector<uint16_t, StateAllocator<uint16_t>>;
  std::vector<Copy16> unit16_;
  std::vector<const float*> unit16_from_;

  Activations acts_;          // forward() / backward()'s
  BlockActs recompute_acts_;  // a recomputed block's activations, during its backward
  // Forward scratch, not needed by backward: a row-parallel linear's (N,C) output (partial
  // under tensor parallelism), its reduced rows (sequence parallelism), gathered rows.
  Floats proj_, proj_rows_, gathered_;
  // Backward scratch, one block's worth.
  Floats dx_, d_ln1_, d_qkv_, d_att_, d_atty_, d_ln2_, d_fch_, d_fch_gelu_, d_lnf_;
  Floats d_all_, d_rows_, d_lnparams_;  // gathered / reduced gradient rows
  // head_share's buffers: its rows' final norm output, logits, loss statistics, input gradient.
  Floats share_ln_, share_logits_, share_max_, share_sum_, share_losses_, share_dln_;
  kernels::Buffer<int> share_targets_;
  int B_ = 0, T_ = 0;           // the scratch's micro-batch shape
  mutable size_t sizings_ = 0;  // activation_sizings()
};

}  // namespace loom::model
