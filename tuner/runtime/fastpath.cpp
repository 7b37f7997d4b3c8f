// tuner.matmul and tuner.linear's repeated calls, compiled (tuner/runtime/fastpath.py builds
// this file).
//
// A repeated call needs only its signature (each tensor's sizes, strides, dtype, device and
// pointer alignment, and allow_tf32) and what the Python dispatcher decided for it on its
// first call: the torch operator (a cuBLAS key), the replay of its Triton launches, or the
// Python path. Computing that signature in Python costs more host time than torch's own call
// of the same GEMM; here it costs a few hundred nanoseconds. Anything this file does not
// handle (a first call, autograd, a dispatch mode, a tensor subclass, unusual arguments) goes
// to the Python function, which validates, decides and raises the errors.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// What the Python dispatcher decided for one signature (`remember`).
enum class Kind { Python, Torch, Replay };

struct Action {
  Kind kind = Kind::Python;
  PyObject* issue = nullptr;  // Replay: issue(a, b, out, bias, scale_a, scale_b), owned
  std::vector<int64_t> out_shape;  // Replay: the new output's shape, dtype and device
  at::ScalarType out_dtype = at::kFloat;
  at::Device device = at::kCPU;
};

// A call's tensors in the order the replay's issue function takes them
// (kernels/launches.operands_of), whichever public function brought them.
constexpr int kOperands = 6;
constexpr int kOut = 2, kBias = 3, kScaleA = 4, kScaleB = 5;

struct Parameter {
  const char* name;
  int operand;  // where the argument goes in Call::operands
};

// One public function: its tensor parameters (the positional ones first), how many may come
// positionally, its Python implementation and the actions by signature.
struct Function {
  const char* name;
  std::vector<Parameter> params;
  Py_ssize_t max_positional;
  PyObject* python = nullptr;
  std::unordered_map<std::string, Action> actions;
};

Function matmul_function{
    "matmul", {{"a", 0}, {"b", 1}, {"out", kOut}, {"scale_a", kScaleA}, {"scale_b", kScaleB}}, 3};
Function linear_function{"linear", {{"x", 0}, {"weight", 1}, {"bias", kBias}}, 3};
PyTypeObject* parameter_type = nullptr;  // torch.nn.Parameter: a plain tensor here

struct Call {
  PyObject* operands[kOperands] = {nullptr};  // borrowed; nullptr where absent or None
  bool allow_tf32 = false;
};

// Puts an argument at its operand (None leaves it absent); false for anything but a plain
// tensor or Parameter (a subclass has rules of its own: the Python function serves it).
bool put(Call& call, int operand, PyObject* arg) {
  if (arg == Py_None) return true;
  if (!THPVariable_CheckExact(arg) && Py_TYPE(arg) != parameter_type) return false;
  call.operands[operand] = arg;
  return true;
}

// Fills `call` from the arguments as Python would bind them; false where the Python function
// should see them instead (unknown keywords, a non-tensor, a subclass).
bool bind(const Function& fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
          Call& call) {
  if (nargs < 2 || nargs > fn.max_positional) return false;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (!put(call, fn.params[i].operand, args[i])) return false;
  }
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  const auto n = fn.params.size();
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    PyObject* value = args[nargs + k];
    if (PyUnicode_CompareWithASCIIString(key, "allow_tf32") == 0) {
      if (value != Py_True && value != Py_False) return false;
      call.allow_tf32 = value == Py_True;
      continue;
    }
    // a and b (x and weight) only come positionally on this path, the rest either way once
    size_t p = std::max<size_t>(2, nargs);
    while (p < n && PyUnicode_CompareWithASCIIString(key, fn.params[p].name) != 0) ++p;
    if (p == n || !put(call, fn.params[p].operand, value)) return false;
  }
  return call.operands[0] != nullptr && call.operands[1] != nullptr;
}

void append(std::string& key, int64_t value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The call's signature, as tuner.runtime.dispatch describes it; false where the call must take
// the Python path whatever it was before (autograd to record, a dispatch mode, a tensor with
// no storage of its own: fake, functional or batched).
bool signature(const Function& fn, const Call& call, std::string& key) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  const bool grad = at::GradMode::is_enabled();
  key.reserve(256);
  append(key, call.allow_tf32);
  for (const Parameter& param : fn.params) {
    PyObject* arg = call.operands[param.operand];
    if (arg == nullptr) {
      append(key, -1);
      continue;
    }
    const at::Tensor& t = THPVariable_Unpack(arg);
    if ((grad && t.requires_grad()) || !t.has_storage() ||
        t.key_set().has(c10::DispatchKey::Python)) {
      return false;
    }
    append(key, t.dim());
    for (int64_t size : t.sizes()) append(key, size);
    for (int64_t stride : t.strides()) append(key, stride);
    append(key, static_cast<int64_t>(t.scalar_type()));
    append(key, static_cast<int64_t>(t.device().type()));
    append(key, t.device().index());
    append(key, reinterpret_cast<uintptr_t>(t.data_ptr()) & 15);
  }
  return true;
}

const at::Tensor* tensor(const Call& call, int operand) {
  PyObject* arg = call.operands[operand];
  return arg == nullptr ? nullptr : &THPVariable_Unpack(arg);
}

// The torch operator a cuBLAS key calls: what torch.matmul and F.linear reach. Unlike torch's
// bindings it keeps the GIL: releasing and taking it back costs more than this file saves.
at::Tensor torch_call(const Function& fn, const Call& call) {
  const at::Tensor& a = *tensor(call, 0);
  const at::Tensor& b = *tensor(call, 1);
  if (&fn == &linear_function) {
    const at::Tensor* bias = tensor(call, kBias);
    if (a.dim() != 2) return bias == nullptr ? at::linear(a, b) : at::linear(a, b, *bias);
    // What at::linear does for a 2-D x, without its composite layers.
    return bias == nullptr ? at::mm(a, b.t()) : at::addmm(*bias, a, b.t());
  }
  const at::Tensor* out = tensor(call, kOut);
  if (call.operands[kScaleA] != nullptr) {
    const at::Tensor& scale_a = *tensor(call, kScaleA);
    const at::Tensor& scale_b = *tensor(call, kScaleB);
    if (out == nullptr) {
      return at::_scaled_mm(a, b, scale_a, scale_b, std::nullopt, std::nullopt, at::kBFloat16);
    }
    at::Tensor result = *out;
    at::_scaled_mm_out(result, a, b, scale_a, scale_b, std::nullopt, std::nullopt,
                       at::kBFloat16);
    return result;
  }
  if (out == nullptr) return at::mm(a, b);
  at::Tensor result = *out;
  at::mm_out(result, a, b);
  return result;
}

// A new output (or the caller's `out`), filled by the recorded launches.
PyObject* replay(const Call& call, const Action& action) {
  PyObject* out = call.operands[kOut];
  if (out != nullptr) {
    Py_INCREF(out);
  } else {
    at::Tensor fresh = at::empty(action.out_shape,
                                 at::TensorOptions().dtype(action.out_dtype).device(action.device));
    out = THPVariable_Wrap(std::move(fresh));
    if (out == nullptr) return nullptr;
  }
  PyObject* operands[kOperands];
  for (int i = 0; i < kOperands; ++i) {
    operands[i] = call.operands[i] == nullptr ? Py_None : call.operands[i];
  }
  operands[kOut] = out;
  // Held for the call: Python code may run another thread meanwhile, and `clear` drop it.
  PyObject* issue = action.issue;
  Py_INCREF(issue);
  PyObject* issued = PyObject_Vectorcall(issue, operands, kOperands, nullptr);
  Py_DECREF(issue);
  if (issued == nullptr) {
    Py_DECREF(out);
    return nullptr;
  }
  Py_DECREF(issued);
  return out;
}

PyObject* dispatch(Function& fn, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  Call call;
  std::string key;
  if (bind(fn, args, nargs, kwnames, call) && signature(fn, call, key)) {
    auto found = fn.actions.find(key);
    if (found != fn.actions.end()) {
      const Action& action = found->second;
      if (action.kind == Kind::Torch) {
        at::Tensor result = torch_call(fn, call);
        if (PyObject* out = call.operands[kOut]) {  // the caller's own: matmul(..., out)
          Py_INCREF(out);
          return out;
        }
        return THPVariable_Wrap(std::move(result));
      }
      if (action.kind == Kind::Replay) return replay(call, action);
    }
  }
  return PyObject_Vectorcall(fn.python, args, nargs, kwnames);
  END_HANDLE_TH_ERRORS
}

PyObject* matmul(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return dispatch(matmul_function, args, nargs, kwnames);
}

PyObject* linear(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return dispatch(linear_function, args, nargs, kwnames);
}

Function* function_named(PyObject* name) {
  if (PyUnicode_CompareWithASCIIString(name, "matmul") == 0) return &matmul_function;
  if (PyUnicode_CompareWithASCIIString(name, "linear") == 0) return &linear_function;
  PyErr_Format(PyExc_ValueError, "no function %R", name);
  return nullptr;
}

// install(name, python_function, parameter_type): the Python implementation behind `name`.
PyObject* install(PyObject*, PyObject* args) {
  PyObject *name, *python, *parameter;
  if (!PyArg_ParseTuple(args, "UOO!", &name, &python, &PyType_Type, &parameter)) return nullptr;
  Function* fn = function_named(name);
  if (fn == nullptr) return nullptr;
  Py_INCREF(python);
  Py_XDECREF(fn->python);
  fn->python = python;
  Py_INCREF(parameter);
  Py_XDECREF(reinterpret_cast<PyObject*>(parameter_type));
  parameter_type = reinterpret_cast<PyTypeObject*>(parameter);
  Py_RETURN_NONE;
}

// remember(name, action, operands, allow_tf32): later calls of `name` with the signature of
// these operands (a, b, out, bias, scale_a, scale_b; None where absent) take `action`: None
// (the Python path), "torch" (the operator), or (issue, example_output). False where such
// calls cannot be served here at all, or the signature has its action already.
PyObject* remember(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *name, *action_object, *operands;
  int allow_tf32;
  if (!PyArg_ParseTuple(args, "UOO!p", &name, &action_object, &PyTuple_Type, &operands,
                        &allow_tf32)) {
    return nullptr;
  }
  Function* fn = function_named(name);
  if (fn == nullptr) return nullptr;
  if (PyTuple_GET_SIZE(operands) != kOperands) {
    PyErr_SetString(PyExc_ValueError, "remember: operands are (a, b, out, bias, scale_a, scale_b)");
    return nullptr;
  }
  Call call;
  call.allow_tf32 = allow_tf32;
  bool known = true;
  for (const Parameter& param : fn->params) {
    known = known && put(call, param.operand, PyTuple_GET_ITEM(operands, param.operand));
  }
  std::string key;
  known = known && call.operands[0] != nullptr && call.operands[1] != nullptr &&
          signature(*fn, call, key);
  if (!known || fn->actions.count(key)) Py_RETURN_FALSE;
  Action action;
  if (action_object == Py_None) {
    action.kind = Kind::Python;
  } else if (PyUnicode_Check(action_object) &&
             PyUnicode_CompareWithASCIIString(action_object, "torch") == 0) {
    action.kind = Kind::Torch;
  } else {
    PyObject *issue, *example;
    if (!PyArg_ParseTuple(action_object, "OO", &issue, &example)) return nullptr;
    if (!THPVariable_Check(example)) {
      PyErr_SetString(PyExc_TypeError, "remember: the example output must be a tensor");
      return nullptr;
    }
    const at::Tensor& out = THPVariable_Unpack(example);
    action.kind = Kind::Replay;
    Py_INCREF(issue);
    action.issue = issue;
    action.out_shape = out.sizes().vec();
    action.out_dtype = out.scalar_type();
    action.device = out.device();
  }
  fn->actions.emplace(std::move(key), std::move(action));
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyObject* clear(PyObject*, PyObject*) {
  for (Function* fn : {&matmul_function, &linear_function}) {
    for (auto& entry : fn->actions) Py_XDECREF(entry.second.issue);
    fn->actions.clear();
  }
  Py_RETURN_NONE;
}

PyObject* size(PyObject*, PyObject*) {
  return PyLong_FromSize_t(matmul_function.actions.size() + linear_function.actions.size());
}

PyMethodDef methods[] = {
    {"matmul", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(matmul)),
     METH_FASTCALL | METH_KEYWORDS,
     "matmul($module, /, a, b, out=None, *, scale_a=None, scale_b=None, allow_tf32=False)\n"
     "--\n\n"
     "a @ b with the tuned config for its shape (tuner.runtime.dispatch.matmul says all).\n"},
    {"linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(linear)),
     METH_FASTCALL | METH_KEYWORDS,
     "linear($module, /, x, weight, bias=None, *, allow_tf32=False)\n"
     "--\n\n"
     "x @ weight^T + bias with the tuned config (tuner.runtime.dispatch.linear says all).\n"},
    {"install", install, METH_VARARGS, "install(name, python_function, parameter_type)"},
    {"remember", remember, METH_VARARGS, "remember(name, action, args, kwargs) -> bool"},
    {"clear", clear, METH_NOARGS, "Forget every remembered signature."},
    {"size", size, METH_NOARGS, "How many signatures are remembered."},
    {nullptr, nullptr, 0, nullptr}};

#define TUNER_STRING(x) #x
#define TUNER_NAME(x) TUNER_STRING(x)
PyModuleDef module_def = {PyModuleDef_HEAD_INIT, TUNER_NAME(TORCH_EXTENSION_NAME), nullptr, -1,
                          methods};

}  // namespace

#define TUNER_JOIN(a, b) a##b
#define TUNER_INIT(name) TUNER_JOIN(PyInit_, name)
PyMODINIT_FUNC TUNER_INIT(TORCH_EXTENSION_NAME)() { return PyModule_Create(&module_def); }
