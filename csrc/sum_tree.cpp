// CPU kernels of distrl::sum_tree_update and distrl::sum_tree_sample (layout: sum_tree.h).
//
// Both walk the whole batch one tree level at a time rather than one sample at a time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "sum_tree.h"

namespace distrl {
namespace {

// Sorts non-negative keys below 2^bits in place: LSD radix sort, 11 bits per pass. For a
// batch of a few hundred nodes this is several times faster than std::sort, whose
// comparisons of random keys mispredict about every other branch.
void radix_sort(std::vector<int64_t>& keys, int bits) {
  constexpr int kDigitBits = 11;
  constexpr int64_t kBuckets = int64_t{1} << kDigitBits;
  std::vector<int64_t> scratch(keys.size());
  std::vector<int64_t> counts(kBuckets);
  for (int shift = 0; shift < bits; shift += kDigitBits) {
    std::fill(counts.begin(), counts.end(), 0);
    for (const int64_t key : keys) ++counts[(key >> shift) & (kBuckets - 1)];
    int64_t position = 0;
    for (int64_t& count : counts) {
      const int64_t here = count;
      count = position;
      position += here;
    }
    for (const int64_t key : keys) scratch[counts[(key >> shift) & (kBuckets - 1)]++] = key;
    keys.swap(scratch);
  }
}

// Number of bits of the largest value below `limit`.
int bits_below(int64_t limit) {
  int bits = 1;
  while ((int64_t{1} << bits) < limit) ++bits;
  return bits;
}

// Recomputes node j of a level from its K children in the level below: the sum in
// float64 in child order (rounded once to the tree's dtype), the minimum.
template <typename scalar_t>
inline void recompute(scalar_t* sums, scalar_t* mins, int64_t parent_offset,
                      int64_t child_offset, int64_t j) {
  const scalar_t* child_sums = sums + child_offset + kFanout * j;
  const scalar_t* child_mins = mins + child_offset + kFanout * j;
  double sum = 0.0;
  scalar_t low = child_mins[0];
  for (int c = 0; c < kFanout; ++c) sum += static_cast<double>(child_sums[c]);
  for (int c = 1; c < kFanout; ++c) low = std::min(low, child_mins[c]);
  sums[parent_offset + j] = static_cast<scalar_t>(sum);
  mins[parent_offset + j] = low;
}

template <typename scalar_t>
void update_cpu(scalar_t* sums, scalar_t* mins, int64_t capacity, const SumTreeLayout& layout,
                const int64_t* indices, const scalar_t* priorities, int64_t batch) {
  constexpr scalar_t kNone = std::numeric_limits<scalar_t>::infinity();
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t index = indices[i];
    TORCH_CHECK(index >= 0 && index < capacity, "sum_tree_update: index ", index,
                " is outside the tree's capacity ", capacity);
    const scalar_t priority = priorities[i];
    TORCH_CHECK(std::isfinite(priority) && priority >= 0,
                "sum_tree_update: priorities must be finite and >= 0, got ", priority,
                " for index ", index);
  }
  const int depth = layout.depth;
  const int64_t leaf_offset = layout.offset[depth];
  // Batch order, so a duplicated index keeps its last priority.
  std::vector<int64_t> nodes(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t leaf = leaf_offset + indices[i];
    sums[leaf] = priorities[i];
    mins[leaf] = priorities[i] > 0 ? priorities[i] : kNone;
    nodes[i] = indices[i] / kFanout;  // parent, numbered within its level
  }
  if (depth == 0) return;  // capacity 1: the leaf is the root
  if (nodes.size() < 64) {
    std::sort(nodes.begin(), nodes.end());
  } else {
    radix_sort(nodes, bits_below(layout.offset[depth] - layout.offset[depth - 1]));
  }
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  // A sorted unique list stays sorted under / K, so adjacent duplicates are the only
  // ones and each ancestor is recomputed once per level.
  for (int d = depth - 1; d >= 0; --d) {
    size_t kept = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int64_t j = nodes[i];
      recompute(sums, mins, layout.offset[d], layout.offset[d + 1], j);
      const int64_t parent = j / kFanout;
      if (kept == 0 || nodes[kept - 1] != parent) nodes[kept++] = parent;
    }
    nodes.resize(kept);
  }
}

template <typename scalar_t>
void sample_cpu(const scalar_t* sums, const SumTreeLayout& layout, const scalar_t* uniforms,
                int64_t batch, int64_t begin, int64_t end, int64_t* out_indices,
                scalar_t* out_probabilities) {
  const double total = sums[0];
  const double segment = total / static_cast<double>(batch);
  const int64_t count = end - begin;
  std::vector<int64_t> node(static_cast<size_t>(count), 0);
  std::vector<double> mass(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    mass[j] = (static_cast<double>(begin + j) + static_cast<double>(uniforms[begin + j])) * segment;
  }
  // The whole batch descends one level at a time: the loads of a level are independent
  // across draws, so their cache misses overlap instead of forming one chain per draw.
  for (int d = 0; d < layout.depth; ++d) {
    const scalar_t* children = sums + layout.offset[d + 1];
    const bool has_next = d + 1 < layout.depth;
    const scalar_t* grandchildren = sums + layout.offset[has_next ? d + 2 : d + 1];
    for (int64_t j = 0; j < count; ++j) {
      const int64_t child = kFanout * node[j] + choose_child(children + kFanout * node[j], mass[j]);
      node[j] = child;
      if (has_next) __builtin_prefetch(grandchildren + kFanout * child);  // its children
    }
  }
  const scalar_t* leaves = sums + layout.offset[layout.depth];
  for (int64_t j = 0; j < count; ++j) {
    out_indices[begin + j] = node[j];
    out_probabilities[begin + j] = static_cast<scalar_t>(leaves[node[j]] / total);
  }
}

void sum_tree_update_cpu(at::Tensor tree, int64_t capacity, const at::Tensor& indices,
                         const at::Tensor& priorities) {
  const SumTreeLayout layout = checked_layout(tree, capacity, "sum_tree_update");
  check_update_args(tree, indices, priorities);
  const at::Tensor indices_c = indices.contiguous();
  const at::Tensor priorities_c = priorities.contiguous();
  AT_DISPATCH_FLOATING_TYPES(tree.scalar_type(), "sum_tree_update", [&] {
    scalar_t* sums = tree.data_ptr<scalar_t>();
    update_cpu<scalar_t>(sums, sums + tree.size(1), capacity, layout,
                         indices_c.data_ptr<int64_t>(), priorities_c.data_ptr<scalar_t>(),
                         indices_c.size(0));
  });
}

std::tuple<at::Tensor, at::Tensor> sum_tree_sample_cpu(const at::Tensor& tree, int64_t capacity,
                                                       const at::Tensor& uniforms) {
  const SumTreeLayout layout = checked_layout(tree, capacity, "sum_tree_sample");
  check_sample_args(tree, uniforms);
  const at::Tensor uniforms_c = uniforms.contiguous();
  const int64_t batch = uniforms_c.size(0);
  at::Tensor out_indices = at::empty({batch}, tree.options().dtype(at::kLong));
  at::Tensor out_probabilities = at::empty({batch}, tree.options());
  AT_DISPATCH_FLOATING_TYPES(tree.scalar_type(), "sum_tree_sample", [&] {
    const scalar_t* sums = tree.data_ptr<scalar_t>();
    const scalar_t* u = uniforms_c.data_ptr<scalar_t>();
    const double total = sums[0];
    TORCH_CHECK(std::isfinite(total) && total > 0,
                "sum_tree_sample: cannot sample, the total priority is ", total,
                "; it must be finite and > 0 (all priorities zero, or a sum past the dtype's "
                "range)");
    for (int64_t i = 0; i < batch; ++i) {
      TORCH_CHECK(u[i] >= 0 && u[i] < 1, "sum_tree_sample: uniforms must lie in [0, 1), got ",
                  u[i], " at position ", i);
    }
    at::parallel_for(0, batch, 256, [&](int64_t begin, int64_t end) {
      sample_cpu<scalar_t>(sums, layout, u, batch, begin, end, out_indices.data_ptr<int64_t>(),
                           out_probabilities.data_ptr<scalar_t>());
    });
  });
  return {out_indices, out_probabilities};
}

}  // namespace

TORCH_LIBRARY_IMPL(distrl, CPU, m) {
  m.impl("sum_tree_update", &sum_tree_update_cpu);
  m.impl("sum_tree_sample", &sum_tree_sample_cpu);
}

}  // namespace distrl
