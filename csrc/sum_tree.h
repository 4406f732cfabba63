// Layout and argument checks shared by the CPU and CUDA sum-tree kernels.
//
// A sum tree of L leaf slots (L a power of two, so any capacity <= L fits) is one tensor
// of shape [2, 2L]: row 0 holds sums, row 1 minima over positive priorities (+inf where a
// subtree has none). Node 1 is the root, node k has children 2k and 2k+1, and leaf i is
// node L+i. Column 0 is unused. The total mass is tree[0][1] and the smallest positive
// priority tree[1][1], so importance weights need no scan of the leaves.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace distrl {

// Number of leaf slots L of a [2, 2L] tree tensor.
inline int64_t sum_tree_leaves(const at::Tensor& tree, const char* op) {
  TORCH_CHECK(tree.dim() == 2 && tree.size(0) == 2, op,
              ": tree must have shape [2, 2L] (row 0 sums, row 1 minima), got ", tree.sizes());
  const int64_t width = tree.size(1);
  TORCH_CHECK(width >= 2 && (width & (width - 1)) == 0, op,
              ": tree width 2L must be a power of two >= 2, got ", width);
  TORCH_CHECK(tree.scalar_type() == at::kFloat || tree.scalar_type() == at::kDouble, op,
              ": tree must be float32 or float64, got ", tree.scalar_type());
  TORCH_CHECK(tree.is_contiguous(), op, ": tree must be contiguous");
  return width / 2;
}

// Levels between the root and the leaves: log2(L).
inline int sum_tree_depth(int64_t leaves) {
  int depth = 0;
  while ((int64_t{1} << depth) < leaves) ++depth;
  return depth;
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

}  // namespace distrl
