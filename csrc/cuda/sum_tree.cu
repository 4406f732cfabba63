// CUDA kernels of distrl::sum_tree_update and distrl::sum_tree_sample (layout: ../sum_tree.h),
// launched on the current stream.
//
// Sampling: one thread per draw descends from the root. Updating: a stable sort of the
// indices puts duplicates side by side with the last write of each index last; one block
// then writes the winning leaves and recomputes the changed ancestors level by level,
// with the block barrier between levels, so each ancestor is written once per level.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cmath>

#include "../sum_tree.h"

namespace distrl {
namespace {

constexpr int kUpdateThreads = 1024;
constexpr int kSampleThreads = 256;

template <typename scalar_t>
__global__ void update_kernel(scalar_t* sums, scalar_t* mins, int64_t capacity,
                              SumTreeLayout layout, const int64_t* sorted_indices,
                              const int64_t* order, const scalar_t* priorities, int64_t batch) {
  const int64_t leaf_offset = layout.offset[layout.depth];
  for (int64_t i = threadIdx.x; i < batch; i += blockDim.x) {
    const int64_t index = sorted_indices[i];
    CUDA_KERNEL_ASSERT(index >= 0 && index < capacity);
    // The stable sort keeps batch order among equal indices: the last one wins.
    if (i + 1 == batch || sorted_indices[i + 1] != index) {
      const scalar_t priority = priorities[order[i]];
      sums[leaf_offset + index] = priority;
      mins[leaf_offset + index] = priority > 0 ? priority : static_cast<scalar_t>(INFINITY);
    }
  }
  __syncthreads();
  int64_t span = 1;  // leaves under one node of level d
  for (int d = layout.depth - 1; d >= 0; --d) {
    span *= kFanout;
    for (int64_t i = threadIdx.x; i < batch; i += blockDim.x) {
      const int64_t j = sorted_indices[i] / span;
      if (i > 0 && sorted_indices[i - 1] / span == j) continue;  // its first index does it
      // As the CPU kernel: float64 sum in child order, rounded once.
      const scalar_t* child_sums = sums + layout.offset[d + 1] + kFanout * j;
      const scalar_t* child_mins = mins + layout.offset[d + 1] + kFanout * j;
      double sum = 0.0;
      scalar_t low = child_mins[0];
      for (int c = 0; c < kFanout; ++c) sum += static_cast<double>(child_sums[c]);
      for (int c = 1; c < kFanout; ++c) low = min(low, child_mins[c]);
      sums[layout.offset[d] + j] = static_cast<scalar_t>(sum);
      mins[layout.offset[d] + j] = low;
    }
    __syncthreads();
  }
}

template <typename scalar_t>
__global__ void sample_kernel(const scalar_t* sums, SumTreeLayout layout,
                              const scalar_t* uniforms, int64_t batch, int64_t* out_indices,
                              scalar_t* out_probabilities) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= batch) return;
  const double total = sums[0];
  // SumTree.sample refuses an empty or overflowed tree before launching; called raw, the
  // op marks every draw with index -1 rather than synchronising to raise.
  if (!(total > 0) || isinf(total)) {
    out_indices[i] = -1;
    out_probabilities[i] = 0;
    return;
  }
  double mass = (static_cast<double>(i) + static_cast<double>(uniforms[i])) *
                (total / static_cast<double>(batch));
  int64_t node = 0;
  for (int d = 0; d < layout.depth; ++d) {
    const scalar_t* children = sums + layout.offset[d + 1] + kFanout * node;
    node = kFanout * node + choose_child(children, mass);
  }
  out_indices[i] = node;
  out_probabilities[i] = static_cast<scalar_t>(sums[layout.offset[layout.depth] + node] / total);
}

void sum_tree_update_cuda(at::Tensor tree, int64_t capacity, const at::Tensor& indices,
                          const at::Tensor& priorities) {
  const SumTreeLayout layout = checked_layout(tree, capacity, "sum_tree_update");
  check_update_args(tree, indices, priorities);
  const int64_t batch = indices.size(0);
  if (batch == 0) return;
  const c10::cuda::CUDAGuard guard(tree.device());
  auto [sorted_indices, order] = at::sort(indices, /*stable=*/true, /*dim=*/0,
                                          /*descending=*/false);
  const at::Tensor priorities_c = priorities.contiguous();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(tree.scalar_type(), "sum_tree_update_cuda", [&] {
    scalar_t* sums = tree.data_ptr<scalar_t>();
    update_kernel<scalar_t><<<1, kUpdateThreads, 0, stream>>>(
        sums, sums + tree.size(1), capacity, layout, sorted_indices.data_ptr<int64_t>(),
        order.data_ptr<int64_t>(), priorities_c.data_ptr<scalar_t>(), batch);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> sum_tree_sample_cuda(const at::Tensor& tree, int64_t capacity,
                                                        const at::Tensor& uniforms) {
  const SumTreeLayout layout = checked_layout(tree, capacity, "sum_tree_sample");
  check_sample_args(tree, uniforms);
  const c10::cuda::CUDAGuard guard(tree.device());
  const at::Tensor uniforms_c = uniforms.contiguous();
  const int64_t batch = uniforms_c.size(0);
  at::Tensor out_indices = at::empty({batch}, tree.options().dtype(at::kLong));
  at::Tensor out_probabilities = at::empty({batch}, tree.options());
  const int blocks = static_cast<int>((batch + kSampleThreads - 1) / kSampleThreads);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(tree.scalar_type(), "sum_tree_sample_cuda", [&] {
    sample_kernel<scalar_t><<<blocks, kSampleThreads, 0, stream>>>(
        tree.data_ptr<scalar_t>(), layout, uniforms_c.data_ptr<scalar_t>(), batch,
        out_indices.data_ptr<int64_t>(), out_probabilities.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out_indices, out_probabilities};
}

}  // namespace

TORCH_LIBRARY_IMPL(distrl, CUDA, m) {
  m.impl("sum_tree_update", &sum_tree_update_cuda);
  m.impl("sum_tree_sample", &sum_tree_sample_cuda);
}

}  // namespace distrl
