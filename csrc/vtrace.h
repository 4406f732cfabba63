// Argument checks shared by the CPU and CUDA kernels of distrl::vtrace.
#pragma once

#include <limits>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace distrl {

inline void check_vtrace_args(const at::Tensor& log_rhos, const at::Tensor& discounts,
                              const at::Tensor& rewards, const at::Tensor& values,
                              const at::Tensor& bootstrap_value,
                              std::optional<double> clip_rho_threshold,
                              std::optional<double> clip_c_threshold,
                              std::optional<double> clip_pg_rho_threshold, double lambda) {
  TORCH_CHECK(log_rhos.dim() == 2, "vtrace: log_rhos must have shape [T, B], got ",
              log_rhos.sizes());
  TORCH_CHECK(log_rhos.scalar_type() == at::kFloat || log_rhos.scalar_type() == at::kDouble,
              "vtrace: log_rhos must be float32 or float64, got ", log_rhos.scalar_type());
  const char* names[] = {"discounts", "rewards", "values"};
  const at::Tensor* tensors[] = {&discounts, &rewards, &values};
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK(tensors[i]->sizes() == log_rhos.sizes(), "vtrace: ", names[i],
                " must have shape [T, B] = ", log_rhos.sizes(), ", got ", tensors[i]->sizes());
    TORCH_CHECK(tensors[i]->scalar_type() == log_rhos.scalar_type(), "vtrace: ", names[i],
                " must have the dtype of log_rhos (", log_rhos.scalar_type(), "), got ",
                tensors[i]->scalar_type());
    TORCH_CHECK(tensors[i]->device() == log_rhos.device(), "vtrace: ", names[i],
                " must be on the device of log_rhos (", log_rhos.device(), "), got ",
                tensors[i]->device());
  }
  TORCH_CHECK(bootstrap_value.dim() == 1 && bootstrap_value.size(0) == log_rhos.size(1),
              "vtrace: bootstrap_value must have shape [B] = [", log_rhos.size(1), "], got ",
              bootstrap_value.sizes());
  TORCH_CHECK(bootstrap_value.scalar_type() == log_rhos.scalar_type(),
              "vtrace: bootstrap_value must have the dtype of log_rhos (", log_rhos.scalar_type(),
              "), got ", bootstrap_value.scalar_type());
  TORCH_CHECK(bootstrap_value.device() == log_rhos.device(),
              "vtrace: bootstrap_value must be on the device of log_rhos");
  const char* clip_names[] = {"clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold"};
  const std::optional<double> clips[] = {clip_rho_threshold, clip_c_threshold,
                                         clip_pg_rho_threshold};
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK(!clips[i].has_value() || *clips[i] > 0, "vtrace: ", clip_names[i],
                " must be positive or None (no clipping), got ", clips[i].value_or(0));
  }
  TORCH_CHECK(lambda >= 0 && lambda <= 1, "vtrace: lambda_ must be in [0, 1], got ", lambda);
}

// An absent threshold clips nothing: min(rho, +inf) == rho.
inline double clip_or_inf(std::optional<double> threshold) {
  return threshold.value_or(std::numeric_limits<double>::infinity());
}

}  // namespace distrl
