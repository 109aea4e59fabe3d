// A decoder-only transformer language model over bytes, with a hand-written backward.
//
//   tokens [nseq, T] -> x = wte[token] + wpe[position]                       x: [n, d], n = nseq * T
//   per block:  x += Attention(RMSNorm(x)) ;  x += MLP(RMSNorm(x))            (pre-norm residual blocks)
//               MLP is dense (d -> d_ff -> d, GELU) or, in every moe_every-th block, a mixture of experts (moe.h)
//   logits = RMSNorm(x) @ wout                                               logits: [n, 256]
//   loss = mean over tokens of softmax cross-entropy against the next byte (+ aux_weight * load-balancing loss)
//
// Parameters are grouped in *units*, the granularity at which FSDP gathers and reduces them: the embeddings, each
// block, and the head. A unit is one flat fp32 buffer; its tensors lie at fixed offsets inside it. The model never
// owns these parameters: it asks a ParamStore for a unit's full parameters just before using them and hands the
// unit's gradient back just after, which is exactly where FSDP's hooks sit. Experts are not in any unit: each rank
// owns its experts outright (expert parallelism, moe.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace trainer {

class Dist;
class MoeLayer;

struct ModelConfig {
  int vocab = 256;  // bytes
  int seq_len = 64;
  int d_model = 128;
  int n_layers = 4;
  int n_heads = 4;
  int d_ff = 512;
  // Mixture of experts: 0 experts means dense MLPs everywhere. Otherwise block l is an MoE block when
  // (l + 1) % moe_every == 0.
  int n_experts = 0;
  int top_k = 2;
  float capacity_factor = 1.25f;
  int d_expert = 256;
  int moe_every = 2;
  float init_std = 0.02f;

  bool is_moe_block(int l) const { return n_experts > 0 && (l + 1) % moe_every == 0; }
  int head_dim() const { return d_model / n_heads; }
  // One line naming every field that shapes the parameters or the function; the checkpoint hash covers it.
  std::string describe() const;
  uint64_t hash() const;
  // Throws std::invalid_argument naming the first field that makes no model.
  void validate() const;
};

struct Tensor {
  std::string name;
  size_t offset = 0;  // elements from the start of its unit
  int rows = 0, cols = 0;
  bool decay = false;  // AdamW weight decay applies (matrices of matrix products; not embeddings, not gains)
  float init_std = 0;  // 0: initialised to ones (RMSNorm gains)
  size_t numel() const { return size_t(rows) * cols; }
};

struct Unit {
  std::string name;
  std::vector<Tensor> tensors;
  size_t numel = 0;
};

// Units in forward order: embed, block0 .. block(L-1), head.
std::vector<Unit> make_layout(const ModelConfig& c);

// Fills elements [first, first + count) of unit u's flat parameters with their initial values (ops.h init_normal,
// so any split of a unit initialises to the same values as the whole).
void init_unit(const ModelConfig& c, const Unit& unit, int u, uint64_t seed, float* out, size_t first, size_t count);

// One named buffer of a rank's state, as checkpoints store it.
struct StateBuffer {
  std::string name;
  std::span<float> data;
};

// A slice of parameters the optimizer updates, with its gradient and AdamW moments.
struct Segment {
  float* param;
  const float* grad;
  float* m;
  float* v;
  size_t n;
  bool decay;
};

// Who holds the dense parameters: all of them in one process (FullParams), or a shard per rank (ShardedParams,
// FSDP). The model calls, per pass: begin_pass, then forward_params / forward_done for units 0..U-1, then (when
// training) backward_params / grads / backward_done for units U-1..0, then end_pass.
class ParamStore {
 public:
  virtual ~ParamStore() = default;
  virtual void begin_pass(bool with_backward) = 0;
  // Full parameters of unit u (its Unit layout), valid until forward_done(u).
  virtual const float* forward_params(int u) = 0;
  virtual void forward_done(int u) = 0;
  // Full parameters of unit u again, valid until backward_done(u).
  virtual const float* backward_params(int u) = 0;
  // A zeroed buffer for unit u's full gradient, which the model accumulates into.
  virtual float* grads(int u) = 0;
  // Unit u's gradient is complete: reduce it to its owners.
  virtual void backward_done(int u) = 0;
  // Waits for every outstanding reduction: after it the gradients of segments() are final.
  virtual void end_pass() = 0;
  // The parameters this rank updates.
  virtual std::vector<Segment> segments() = 0;
  // The parameters and AdamW moments this rank holds, for checkpoints (gradients are recomputed every step).
  virtual std::vector<StateBuffer> state() = 0;
  // Bytes this rank keeps for the whole run: parameters, gradients, optimizer moments (the 1/N part of ZeRO-3),
  // and the transient full-unit buffers of gathers and gradients (independent of N).
  struct Memory {
    size_t params = 0, grads = 0, optimizer = 0, transient = 0;
  };
  virtual Memory memory() const = 0;
};

class Model {
 public:
  // nseq: sequences per rank in one pass. dist: null in one process; its expert communicator places the experts.
  Model(const ModelConfig& c, int nseq, uint64_t seed, Dist* dist);
  ~Model();

  const ModelConfig& config() const { return c_; }
  const std::vector<Unit>& layout() const { return units_; }

  struct Losses {
    double ce_sum = 0;   // sum over this rank's tokens of -log p(next byte)
    double aux_sum = 0;  // sum over this rank's sequences and MoE blocks of the load-balancing loss
  };
  // One forward (and, when train, backward) pass over this rank's sequences: batch is [nseq, T + 1] bytes (inputs
  // are columns 0..T-1, targets 1..T). Gradients are those of
  //   ce_sum * ce_scale + aux_sum * aux_scale
  // so with ce_scale = 1 / global tokens and aux_scale = aux_weight / global sequences the ranks' gradients sum to
  // the gradient of the global mean loss.
  Losses run(const uint8_t* batch, ParamStore& store, bool train, float ce_scale, float aux_scale);

  // MoE blocks, in block order (the experts this rank owns live there).
  std::vector<MoeLayer*> moe_layers() const;

 private:
  struct Block;  // one block's activations
  void block_forward(int l, const float* p);
  void block_backward(int l, const float* p, float* g, float aux_scale);

  ModelConfig c_;
  std::vector<Unit> units_;
  int nseq_, n_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<MoeLayer>> moe_;  // per block; null for dense blocks
  std::vector<std::vector<float>> xs_;  // residual stream: xs_[l] enters block l, xs_[L] enters the head; [n, d]
  std::vector<float> hf_, rinvf_;       // head RMSNorm: [n, d], [n]
  std::vector<float> logits_;           // [n, 256]; replaced by their gradient in a training pass
  std::vector<float> dx_, dh_, dqkv_, dff_, scratch_;  // backward scratch: [n, d], [n, d], [n, 3d], [n, d_ff], [T, T]
  std::vector<uint8_t> inputs_, targets_;              // [n] each
  double aux_sum_ = 0;
};

}  // namespace trainer
