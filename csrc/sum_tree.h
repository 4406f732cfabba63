// Layout and argument checks shared by the CPU and CUDA sum-tree kernels.
//
// An 8-ary tree over `capacity` leaves, stored level by level in one [2, width] tensor:
// row 0 holds sums, row 1 minima over positive priorities (+inf where a subtree has
// none). Level 0 is the root alone; level d + 1 holds the children of level d, node j's
// children being entries 8j .. 8j+7 of the next level; the last level holds the leaves.
// Every level starts at a multiple of 8 entries, so a node's children sit together in
// one aligned block of 8: one 64-byte cache line in float64, half of one in float32. A
// draw thus reads about a third of the lines a binary tree makes it read, and the tree
// takes about 1.14 x capacity entries per row instead of up to 4 x capacity.
//
// Level d of D (K = 8, K^D the first power >= capacity) holds ceil(capacity / K^(D-d))
// nodes, padded with empty nodes (sum 0, min +inf) to a multiple of K. The root is
// tree[0][0] (total mass) and tree[1][0] (smallest positive priority), so importance
// weights need no scan of the leaves. The same layout is computed in Python by
// distrl/replay/sum_tree.py:tree_layout.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace distrl {

constexpr int64_t kFanout = 8;
// 8^21 = 2^63 exceeds every int64 capacity.
constexpr int kMaxDepth = 21;

struct SumTreeLayout {
  int depth = 0;                                    // levels below the root
  int64_t offset[kMaxDepth + 2] = {};  // first entry of each level; [depth + 1] = width
};

inline SumTreeLayout sum_tree_layout(int64_t capacity) {
  SumTreeLayout layout;
  // Number of nodes at level d is ceil(capacity / K^(depth - d)).
  int64_t span = 1;  // K^depth
  while (span < capacity) {
    span *= kFanout;
    ++layout.depth;
  }
  int64_t position = 0;
  for (int d = 0; d <= layout.depth; ++d) {
    layout.offset[d] = position;
    const int64_t nodes = (capacity + span - 1) / span;
    position += (nodes + kFanout - 1) / kFanout * kFanout;
    span /= kFanout;
  }
  layout.offset[layout.depth + 1] = position;
  return layout;
}

// Checks a tree tensor against the layout of `capacity` leaves and returns the layout.
inline SumTreeLayout checked_layout(const at::Tensor& tree, int64_t capacity, const char* op) {
  TORCH_CHECK(capacity >= 1, op, ": capacity must be >= 1, got ", capacity);
  const SumTreeLayout layout = sum_tree_layout(capacity);
  const int64_t width = layout.offset[layout.depth + 1];
  TORCH_CHECK(tree.dim() == 2 && tree.size(0) == 2 && tree.size(1) == width, op,
              ": a tree of capacity ", capacity, " must have shape [2, ", width,
              "] (row 0 sums, row 1 minima), got ", tree.sizes());
  TORCH_CHECK(tree.scalar_type() == at::kFloat || tree.scalar_type() == at::kDouble, op,
              ": tree must be float32 or float64, got ", tree.scalar_type());
  TORCH_CHECK(tree.is_contiguous(), op, ": tree must be contiguous");
  return layout;
}

inline void check_update_args(const at::Tensor& tree, const at::Tensor& indices,
                              const at::Tensor& priorities) {
  TORCH_CHECK(indices.dim() == 1 && indices.scalar_type() == at::kLong,
              "sum_tree_update: indices must be a 1-D int64 tensor, got ", indices.scalar_type(),
              " of shape ", indices.sizes());
  TORCH_CHECK(priorities.dim() == 1 && priorities.size(0) == indices.size(0),
              "sum_tree_update: priorities must have shape [", indices.size(0), "], got ",
              priorities.sizes());
  TORCH_CHECK(priorities.scalar_type() == tree.scalar_type(),
              "sum_tree_update: priorities must have the tree's dtype ", tree.scalar_type(),
              ", got ", priorities.scalar_type());
  TORCH_CHECK(indices.device() == tree.device() && priorities.device() == tree.device(),
              "sum_tree_update: tree, indices and priorities must be on one device, got ",
              tree.device(), ", ", indices.device(), ", ", priorities.device());
}

inline void check_sample_args(const at::Tensor& tree, const at::Tensor& uniforms) {
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.size(0) > 0,
              "sum_tree_sample: uniforms must be a non-empty 1-D tensor (one per draw), got shape ",
              uniforms.sizes());
  TORCH_CHECK(uniforms.scalar_type() == tree.scalar_type(),
              "sum_tree_sample: uniforms must have the tree's dtype ", tree.scalar_type(),
              ", got ", uniforms.scalar_type());
  TORCH_CHECK(uniforms.device() == tree.device(),
              "sum_tree_sample: tree and uniforms must be on one device, got ", tree.device(),
              " and ", uniforms.device());
}

// One step of the descent, shared by the CPU and CUDA kernels (and mirrored by
// sample_reference): among the K children `sums` of a node, the one whose interval of
// the running prefix sum holds `mass`. Prefix sums run in float64, in child order. A
// child with zero sum has an empty interval, so it is never chosen; if round-off leaves
// the mass at or past the children's total, the last child with a positive sum is taken
// (never an empty subtree). Returns the child's position and lowers `mass` by the sum
// of the children before it.
template <typename scalar_t>
#ifdef __CUDACC__
__host__ __device__
#endif
inline int choose_child(const scalar_t* sums, double& mass) {
  double prefix[kFanout + 1];
  prefix[0] = 0.0;
  for (int c = 0; c < kFanout; ++c) prefix[c + 1] = prefix[c] + static_cast<double>(sums[c]);
  // Count, not search: independent compares, no data-dependent branch to mispredict.
  int chosen = 0;
  for (int c = 1; c <= kFanout; ++c) chosen += prefix[c] <= mass;
  if (chosen == kFanout) {  // rare: round-off put the mass at or past the children's total
    chosen = 0;
    for (int c = 1; c < kFanout; ++c) chosen = sums[c] > 0 ? c : chosen;
  }
  mass -= prefix[chosen];
  return chosen;
}

}  // namespace distrl
