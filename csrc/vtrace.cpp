// CPU kernel of distrl::vtrace: one backward pass in time over all B columns.
//
// Espeholt et al. 2018, eq. 1 as the recursion
//   v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1})),
//   delta_s V = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s)),
// with c_s = lambda min(c_bar, rho_s) (Remark 1), and the policy-gradient advantage of
// Section 4.2, rho_pg_s (r_s + gamma_s v_{s+1} - V(x_s)); V(x_T) = v_T = bootstrap_value.
// The arithmetic follows the order of distrl/vtrace.py so both paths agree closely.
#include <algorithm>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/exp.h>
#include <torch/library.h>

#include "vtrace.h"

namespace distrl {
namespace {

// One time step over a run of columns. Restrict-qualified parameters (the buffers never
// overlap) let the compiler vectorise the loop; the step's order of arithmetic matches
// distrl/vtrace.py.
template <typename scalar_t>
inline void vtrace_step(int64_t width, const scalar_t* __restrict__ rho_t,
                        const scalar_t* __restrict__ gamma_t,
                        const scalar_t* __restrict__ reward_t,
                        const scalar_t* __restrict__ value_t, scalar_t rho_bar, scalar_t c_bar,
                        scalar_t pg_rho_bar, scalar_t lambda, scalar_t* __restrict__ carry,
                        scalar_t* __restrict__ next_value, scalar_t* __restrict__ next_vs,
                        scalar_t* __restrict__ vs_t, scalar_t* __restrict__ pg_t) {
  for (int64_t b = 0; b < width; ++b) {
    const scalar_t rho = rho_t[b];
    const scalar_t gamma = gamma_t[b];
    const scalar_t reward = reward_t[b];
    const scalar_t value = value_t[b];
    const scalar_t clipped_rho = rho < rho_bar ? rho : rho_bar;
    const scalar_t c = lambda * (rho < c_bar ? rho : c_bar);
    const scalar_t delta = clipped_rho * (reward + gamma * next_value[b] - value);
    const scalar_t carried = delta + (gamma * c) * carry[b];
    const scalar_t vs_here = value + carried;
    pg_t[b] = (rho < pg_rho_bar ? rho : pg_rho_bar) * (reward + gamma * next_vs[b] - value);
    vs_t[b] = vs_here;
    carry[b] = carried;
    next_value[b] = value;
    next_vs[b] = vs_here;
  }
}

template <typename scalar_t>
void vtrace_columns(const scalar_t* rhos, const scalar_t* discounts, const scalar_t* rewards,
                    const scalar_t* values, const scalar_t* bootstrap, int64_t steps,
                    int64_t batch, int64_t begin, int64_t end, scalar_t rho_bar, scalar_t c_bar,
                    scalar_t pg_rho_bar, scalar_t lambda, scalar_t* vs, scalar_t* pg_advantages) {
  // For the columns [begin, end): carry = v_{t+1} - V(x_{t+1}) (zero past the last step),
  // next_value = V(x_{t+1}) and next_vs = v_{t+1} (both the bootstrap at t = T-1).
  const int64_t width = end - begin;
  std::vector<scalar_t> state(static_cast<size_t>(3 * width), scalar_t(0));
  scalar_t* carry = state.data();
  scalar_t* next_value = carry + width;
  scalar_t* next_vs = next_value + width;
  std::copy(bootstrap + begin, bootstrap + end, next_value);
  std::copy(bootstrap + begin, bootstrap + end, next_vs);
  for (int64_t t = steps - 1; t >= 0; --t) {
    const int64_t row = t * batch + begin;
    vtrace_step<scalar_t>(width, rhos + row, discounts + row, rewards + row, values + row,
                          rho_bar, c_bar, pg_rho_bar, lambda, carry, next_value, next_vs,
                          vs + row, pg_advantages + row);
  }
}

std::tuple<at::Tensor, at::Tensor> vtrace_cpu(
    const at::Tensor& log_rhos, const at::Tensor& discounts, const at::Tensor& rewards,
    const at::Tensor& values, const at::Tensor& bootstrap_value,
    std::optional<double> clip_rho_threshold, std::optional<double> clip_c_threshold,
    std::optional<double> clip_pg_rho_threshold, double lambda) {
  check_vtrace_args(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold,
                    clip_c_threshold, clip_pg_rho_threshold, lambda);
  const int64_t steps = log_rhos.size(0);
  const int64_t batch = log_rhos.size(1);
  // torch's exp is vectorised; a scalar exp per element would dominate the loop.
  const at::Tensor rhos = at::exp(log_rhos).contiguous();
  const at::Tensor discounts_c = discounts.contiguous();
  const at::Tensor rewards_c = rewards.contiguous();
  const at::Tensor values_c = values.contiguous();
  const at::Tensor bootstrap_c = bootstrap_value.contiguous();
  at::Tensor vs = at::empty_like(rhos);
  at::Tensor pg_advantages = at::empty_like(rhos);
  // Columns are independent; give each task about 16k elements.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(steps, 1));
  AT_DISPATCH_FLOATING_TYPES(log_rhos.scalar_type(), "vtrace", [&] {
    at::parallel_for(0, batch, grain, [&](int64_t begin, int64_t end) {
      vtrace_columns<scalar_t>(
          rhos.data_ptr<scalar_t>(), discounts_c.data_ptr<scalar_t>(),
          rewards_c.data_ptr<scalar_t>(), values_c.data_ptr<scalar_t>(),
          bootstrap_c.data_ptr<scalar_t>(), steps, batch, begin, end,
          static_cast<scalar_t>(clip_or_inf(clip_rho_threshold)),
          static_cast<scalar_t>(clip_or_inf(clip_c_threshold)),
          static_cast<scalar_t>(clip_or_inf(clip_pg_rho_threshold)),
          static_cast<scalar_t>(lambda), vs.data_ptr<scalar_t>(),
          pg_advantages.data_ptr<scalar_t>());
    });
  });
  return {vs, pg_advantages};
}

}  // namespace

TORCH_LIBRARY_IMPL(distrl, CPU, m) { m.impl("vtrace", &vtrace_cpu); }

}  // namespace distrl
