// Buffer construction, dtype helpers and get_dispatch_layout: which ranks and experts each
// token goes to. Purely local; dispatch exchanges the counts.
#include "common/check.h"
#include "ep/ep.h"

namespace moerl::ep {

size_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F8E4M3: return 1;
  }
  MOERL_FAIL(BadInput, "unknown dtype ", int(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

void Tensor::resize(DType new_dtype, int64_t new_rows, int64_t new_cols) {
  MOERL_CHECK(new_rows >= 0 && new_cols >= 0, "negative tensor shape [", new_rows, ", ",
              new_cols, "]");
  dtype = new_dtype;
  rows = new_rows;
  cols = new_cols;
  bytes.resize(size_t(new_rows) * size_t(new_cols) * dtype_bytes(new_dtype));
}

Buffer::Buffer(transport::Communicator& comm, int num_experts)
    : comm_(comm), num_experts_(num_experts) {
  MOERL_CHECK_INPUT(num_experts > 0 && num_experts % comm.world_size() == 0, "num_experts=",
                    num_experts, " must be a positive multiple of the world size ",
                    comm.world_size(), " (experts are sharded evenly over ranks)");
}

void Buffer::get_dispatch_layout(const topk_idx_t* topk_idx, int64_t num_tokens, int num_topk,
                                 Layout& layout) const {
  const int R = num_ranks(), E = num_experts_, L = num_local_experts();
  MOERL_CHECK_INPUT(num_tokens >= 0 && num_topk > 0, "layout needs num_tokens >= 0 and "
                    "num_topk > 0, got T=", num_tokens, " K=", num_topk);
  MOERL_CHECK_INPUT(num_tokens == 0 || topk_idx != nullptr, "topk_idx is null for T=",
                    num_tokens);
  layout.num_tokens = num_tokens;
  layout.num_topk = num_topk;
  layout.num_tokens_per_rank.assign(size_t(R), 0);
  layout.num_tokens_per_expert.assign(size_t(E), 0);
  layout.is_token_in_rank.assign(size_t(num_tokens) * size_t(R), 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    uint8_t* in_rank = layout.is_token_in_rank.data() + t * R;
    for (int k = 0; k < num_topk; ++k) {
      const topk_idx_t e = topk_idx[t * num_topk + k];
      if (e < 0) {
        MOERL_CHECK_INPUT(e == -1, "topk_idx[", t, ", ", k, "]=", e,
                          " is negative; only -1 (no expert) is allowed");
        continue;
      }
      MOERL_CHECK_INPUT(e < E, "topk_idx[", t, ", ", k, "]=", e, " is not an expert id in [0, ",
                        E, ")");
      ++layout.num_tokens_per_expert[size_t(e)];
      in_rank[e / L] = 1;
    }
    for (int r = 0; r < R; ++r) layout.num_tokens_per_rank[size_t(r)] += in_rank[r];
  }
}

}  // namespace moerl::ep
