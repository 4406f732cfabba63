// Op schemas of the distrl library, declared once; kernels register per device in
// sum_tree.cpp / vtrace.cpp (CPU) and cuda/*.cu (CUDA). Python loads this shared object
// as the module distrl._C (see distrl/ops.py), which runs the registrations below.
#include <Python.h>
#include <torch/library.h>

TORCH_LIBRARY(distrl, m) {
  // tree: [2, width], the 8-ary layout of `capacity` leaves in sum_tree.h (row 0 sums,
  // row 1 minima over positive priorities, +inf where there are none; root at column 0).
  // Writes leaves in batch order (the last write of a duplicated index wins), then
  // recomputes each changed ancestor once per level.
  m.def("sum_tree_update(Tensor(a!) tree, int capacity, Tensor indices, Tensor priorities) -> ()");
  // Stratified proportional sampling (Schaul et al. 2016, Appendix B.2.1): draw i lands at
  // mass (i + uniforms[i]) * total / B. Returns leaf indices and P(i) = p_i / total.
  m.def(
      "sum_tree_sample(Tensor tree, int capacity, Tensor uniforms) -> "
      "(Tensor indices, Tensor probabilities)");
  // V-trace targets and policy-gradient advantages (Espeholt et al. 2018, eq. 1 and
  // Section 4.2, with Remark 1's lambda), time-major [T, B]; a threshold of None is no clip.
  m.def(
      "vtrace(Tensor log_rhos, Tensor discounts, Tensor rewards, Tensor values, "
      "Tensor bootstrap_value, float? clip_rho_threshold, float? clip_c_threshold, "
      "float? clip_pg_rho_threshold, float lambda_) -> (Tensor vs, Tensor pg_advantages)");
}

// A bare module so that `import distrl._C` loads the library; the ops live in torch.ops.distrl.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "distrl compiled ops (torch.ops.distrl)", -1, nullptr};
  return PyModule_Create(&module_def);
}
