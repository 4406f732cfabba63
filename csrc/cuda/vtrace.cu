// CUDA kernel of distrl::vtrace: one thread per column scans backward in time (the
// recursion of ../vtrace.cpp); neighbouring threads read neighbouring columns of a
// time-major row, so every load of a step is coalesced. Launched on the current stream.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../vtrace.h"

namespace distrl {
namespace {

constexpr int kThreads = 128;

template <typename scalar_t>
__global__ void vtrace_kernel(const scalar_t* log_rhos, const scalar_t* discounts,
                              const scalar_t* rewards, const scalar_t* values,
                              const scalar_t* bootstrap, int64_t steps, int64_t batch,
                              scalar_t rho_bar, scalar_t c_bar, scalar_t pg_rho_bar,
                              scalar_t lambda, scalar_t* vs, scalar_t* pg_advantages) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= batch) return;
  scalar_t carry = 0;           // v_{t+1} - V(x_{t+1})
  scalar_t value_tp1 = bootstrap[b];
  scalar_t vs_tp1 = bootstrap[b];
  for (int64_t t = steps - 1; t >= 0; --t) {
    const int64_t pos = t * batch + b;
    const scalar_t rho = exp(log_rhos[pos]);
    const scalar_t gamma = discounts[pos];
    const scalar_t reward = rewards[pos];
    const scalar_t value = values[pos];
    const scalar_t clipped_rho = min(rho, rho_bar);
    const scalar_t c = lambda * min(rho, c_bar);
    const scalar_t delta = clipped_rho * (reward + gamma * value_tp1 - value);
    carry = delta + (gamma * c) * carry;
    const scalar_t vs_t = value + carry;
    vs[pos] = vs_t;
    pg_advantages[pos] = min(rho, pg_rho_bar) * (reward + gamma * vs_tp1 - value);
    value_tp1 = value;
    vs_tp1 = vs_t;
  }
}

std::tuple<at::Tensor, at::Tensor> vtrace_cuda(
    const at::Tensor& log_rhos, const at::Tensor& discounts, const at::Tensor& rewards,
    const at::Tensor& values, const at::Tensor& bootstrap_value,
    std::optional<double> clip_rho_threshold, std::optional<double> clip_c_threshold,
    std::optional<double> clip_pg_rho_threshold, double lambda) {
  check_vtrace_args(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold,
                    clip_c_threshold, clip_pg_rho_threshold, lambda);
  const c10::cuda::CUDAGuard guard(log_rhos.device());
  const int64_t steps = log_rhos.size(0);
  const int64_t batch = log_rhos.size(1);
  const at::Tensor log_rhos_c = log_rhos.contiguous();
  const at::Tensor discounts_c = discounts.contiguous();
  const at::Tensor rewards_c = rewards.contiguous();
  const at::Tensor values_c = values.contiguous();
  const at::Tensor bootstrap_c = bootstrap_value.contiguous();
  at::Tensor vs = at::empty_like(log_rhos_c);
  at::Tensor pg_advantages = at::empty_like(log_rhos_c);
  if (steps == 0 || batch == 0) return {vs, pg_advantages};
  const int blocks = static_cast<int>((batch + kThreads - 1) / kThreads);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(log_rhos.scalar_type(), "vtrace_cuda", [&] {
    vtrace_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        log_rhos_c.data_ptr<scalar_t>(), discounts_c.data_ptr<scalar_t>(),
        rewards_c.data_ptr<scalar_t>(), values_c.data_ptr<scalar_t>(),
        bootstrap_c.data_ptr<scalar_t>(), steps, batch,
        static_cast<scalar_t>(clip_or_inf(clip_rho_threshold)),
        static_cast<scalar_t>(clip_or_inf(clip_c_threshold)),
        static_cast<scalar_t>(clip_or_inf(clip_pg_rho_threshold)),
        static_cast<scalar_t>(lambda), vs.data_ptr<scalar_t>(),
        pg_advantages.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {vs, pg_advantages};
}

}  // namespace

TORCH_LIBRARY_IMPL(distrl, CUDA, m) { m.impl("vtrace", &vtrace_cuda); }

}  // namespace distrl
