// tuner.matmul and tuner.linear's repeated calls, compiled (tuner/runtime/fastpath.py builds
// this file).
//
// A repeated call needs only its signature (each tensor's sizes, strides, dtype, device and
// pointer alignment, and allow_tf32) and what the Python dispatcher decided for it on its
// first call: the torch operator (a cuBLAS key), the replay of its Triton launches, or the
// Python path. Computing that signature in Python costs more host time than torch's own call
// of the same GEMM; here it costs a few hundred nanoseconds. Anything this file does not
// handle (a first call, autograd, a dispatch mode, a tensor subclass, unusual arguments) goes
// to the Python function, which validates, decides and raises the errors. The hooks of
// tuner.enable (below) serve repeated aten calls the same way.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
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

// Appends what of a tensor decides a call (its address only through the alignment Triton
// specializes on); false for a tensor with no storage of its own (fake, functional or
// batched) or one a Python subclass wraps: those take the Python path, every call.
bool describe(std::string& key, const at::Tensor& t) {
  if (!t.has_storage() || t.key_set().has(c10::DispatchKey::Python)) return false;
  append(key, t.dim());
  for (int64_t size : t.sizes()) append(key, size);
  for (int64_t stride : t.strides()) append(key, stride);
  append(key, static_cast<int64_t>(t.scalar_type()));
  append(key, static_cast<int64_t>(t.device().type()));
  append(key, t.device().index());
  append(key, reinterpret_cast<uintptr_t>(t.data_ptr()) & 15);
  return true;
}

// The call's signature, as tuner.runtime.dispatch describes it; false where the call must take
// the Python path whatever it was before (autograd to record, a dispatch mode, `describe`).
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
    if ((grad && t.requires_grad()) || !describe(key, t)) return false;
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

// -- the hooks tuner.enable puts over aten mm, addmm and bmm ----------------------------------
//
// Registered at a device's dispatch key over torch's kernels, which they keep and call for every
// call they do not route. Each call's route is remembered by signature (each tensor as
// `describe` says, addmm's scalars, and TF32 for fp32): torch's kept kernel (a call the tuner
// does not take, or a key it answers with cuBLAS), or the replay of the tuner's launches. Only
// a call whose route is not known (a first call, a dispatch mode, or a route that could not be
// remembered) enters Python: tuner.routing decides, runs it and remembers the route here.
// Torch's bindings release the GIL before dispatching, so a hook runs without it: the kept
// kernel needs none, a replay and Python take it (GIL first, then `lock`, never the reverse).

enum HookOp { kMm, kAddmm, kBmm, kHookOps };
const char* const hook_names[kHookOps] = {"mm", "addmm", "bmm"};

struct Route {
  PyObject* issue = nullptr;  // the replay's issue(a, b, out, bias, scale_a, scale_b), owned;
                              // nullptr: torch's kept kernel
  std::vector<int64_t> out_shape;  // the replay's new output
  at::ScalarType out_dtype = at::kFloat;
  at::Device device = at::kCPU;
};

struct Hook {
  PyObject* python = nullptr;  // tuner.routing's function for the op: result or None
  std::optional<c10::SafeKernelFunction> kept[2];  // torch's kernels on CPU, on CUDA
  std::unordered_map<std::string, Route> routes;
};

struct Hooks {
  std::mutex lock;  // over `routes`, which hooks read without the GIL
  Hook ops[kHookOps];
  std::vector<std::unique_ptr<torch::Library>> libraries;  // destroying one restores torch's
};

// Never destroyed: what it holds must not be released after the interpreter is gone.
Hooks& hooks = *new Hooks();
// True while this thread runs the tuner for a routed call: the GEMMs it issues go to torch.
thread_local bool inside = false;

// One aten call as the hooks see it: addmm's c is the bias, its scalars beta and alpha.
struct HookCall {
  HookOp op;
  c10::DispatchKeySet keyset;
  const at::Tensor& a;
  const at::Tensor& b;
  const at::Tensor* bias = nullptr;
  const c10::Scalar* beta = nullptr;
  const c10::Scalar* alpha = nullptr;
};

struct Gil {
  PyGILState_STATE state = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(state); }
};

[[noreturn]] void raise_python_error() {
  python_error error;
  error.persist();
  throw error;
}

int backend_index(c10::DispatchKeySet keyset) {
  return keyset.highestBackendKey() == c10::BackendComponent::CUDABit ? 1 : 0;
}

at::Tensor kept_call(const HookCall& call) {
  const auto& kernel = hooks.ops[call.op].kept[backend_index(call.keyset)];
  TORCH_CHECK(kernel.has_value(), "gemm-tuner: no kept kernel of aten::", hook_names[call.op]);
  torch::jit::Stack stack;
  if (call.op == kAddmm) {
    stack = {*call.bias, call.a, call.b, *call.beta, *call.alpha};
  } else {
    stack = {call.a, call.b};
  }
  kernel->callBoxed(kernel->opHandle(), call.keyset, &stack);
  return std::move(stack[0]).toTensor();
}

void append_double(std::string& key, double value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void append_scalar(std::string& key, const c10::Scalar& s) {
  append(key, static_cast<int64_t>(s.type()));
  if (s.isComplex()) {
    const c10::complex<double> z = s.toComplexDouble();
    append_double(key, z.real());
    append_double(key, z.imag());
  } else if (s.isFloatingPoint()) {
    append_double(key, s.toDouble());
  } else {
    append(key, s.toLong());  // integral or boolean
  }
}

// The call's signature; false where it must go to Python (a dispatch mode, `describe`).
bool hook_signature(const HookCall& call, std::string& key) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  key.reserve(256);
  append(key, call.a.scalar_type() == at::kFloat && at::globalContext().allowTF32CuBLAS());
  if (!describe(key, call.a) || !describe(key, call.b)) return false;
  if (call.bias != nullptr) {
    if (!describe(key, *call.bias)) return false;
    append_scalar(key, *call.beta);
    append_scalar(key, *call.alpha);
  }
  return true;
}

PyObject* wrap_scalar(const c10::Scalar& s) {
  if (s.isBoolean()) return PyBool_FromLong(s.toBool());
  if (s.isIntegral(false)) return PyLong_FromLongLong(s.toLong());
  if (s.isComplex()) {
    const c10::complex<double> z = s.toComplexDouble();
    return PyComplex_FromDoubles(z.real(), z.imag());
  }
  return PyFloat_FromDouble(s.toDouble());
}

// Calls `function` with these arguments (new references, released here; nullptr: an error is
// set), this thread's GEMMs going to torch meanwhile. Needs the GIL.
PyObject* call_python(PyObject* function, std::vector<PyObject*>& args) {
  PyObject* result = nullptr;
  if (std::find(args.begin(), args.end(), nullptr) == args.end()) {
    const bool was_inside = inside;
    inside = true;
    result = PyObject_Vectorcall(function, args.data(), args.size(), nullptr);
    inside = was_inside;
  }
  for (PyObject* arg : args) Py_XDECREF(arg);
  return result;
}

PyObject* wrap_or_none(const at::Tensor* t) {
  if (t == nullptr) Py_RETURN_NONE;
  return THPVariable_Wrap(*t);
}

// The remembered replay of this call's launches; nullopt where the route went meanwhile.
std::optional<at::Tensor> replay_route(const HookCall& call, const std::string& key) {
  Gil gil;
  PyObject* issue = nullptr;
  at::Tensor out;
  {
    std::lock_guard<std::mutex> guard(hooks.lock);
    auto& routes = hooks.ops[call.op].routes;
    auto found = routes.find(key);
    if (found == routes.end() || found->second.issue == nullptr) return std::nullopt;
    const Route& route = found->second;
    issue = route.issue;
    Py_INCREF(issue);
    out = at::empty(route.out_shape,
                    at::TensorOptions().dtype(route.out_dtype).device(route.device));
  }
  std::vector<PyObject*> args = {THPVariable_Wrap(call.a), THPVariable_Wrap(call.b),
                                 THPVariable_Wrap(out), wrap_or_none(call.bias),
                                 wrap_or_none(nullptr), wrap_or_none(nullptr)};
  PyObject* issued = call_python(issue, args);
  Py_DECREF(issue);
  if (issued == nullptr) raise_python_error();
  Py_DECREF(issued);
  return out;
}

// tuner.routing's answer for the call: its result, or nullopt for torch's kept kernel.
std::optional<at::Tensor> python_route(const HookCall& call) {
  Gil gil;
  PyObject* function = hooks.ops[call.op].python;
  if (function == nullptr) return std::nullopt;  // removed while this call waited
  std::vector<PyObject*> args;
  if (call.op == kAddmm) {
    args = {THPVariable_Wrap(*call.bias), THPVariable_Wrap(call.a), THPVariable_Wrap(call.b),
            wrap_scalar(*call.beta), wrap_scalar(*call.alpha)};
  } else {
    args = {THPVariable_Wrap(call.a), THPVariable_Wrap(call.b)};
  }
  PyObject* result = call_python(function, args);
  if (result == nullptr) raise_python_error();
  std::optional<at::Tensor> routed;
  if (THPVariable_Check(result)) routed = THPVariable_Unpack(result);
  const bool none = result == Py_None;
  Py_DECREF(result);
  if (!routed && !none) {
    PyErr_Format(PyExc_TypeError, "gemm-tuner: tuner.routing.%s returned neither a tensor "
                 "nor None", hook_names[call.op]);
    raise_python_error();
  }
  return routed;
}

at::Tensor serve(const HookCall& call) {
  if (inside) return kept_call(call);
  std::string key;
  if (hook_signature(call, key)) {
    bool found = false, replay = false;
    {
      std::lock_guard<std::mutex> guard(hooks.lock);
      auto& routes = hooks.ops[call.op].routes;
      auto route = routes.find(key);
      if (route != routes.end()) {
        found = true;
        replay = route->second.issue != nullptr;
      }
    }
    if (found && !replay) return kept_call(call);
    if (replay) {
      if (auto out = replay_route(call, key)) return *out;
    }
  }
  std::optional<at::Tensor> routed = python_route(call);
  return routed ? *routed : kept_call(call);
}

at::Tensor hook_mm(c10::DispatchKeySet keyset, const at::Tensor& a, const at::Tensor& b) {
  return serve(HookCall{kMm, keyset, a, b});
}

at::Tensor hook_addmm(c10::DispatchKeySet keyset, const at::Tensor& c, const at::Tensor& a,
                      const at::Tensor& b, const c10::Scalar& beta, const c10::Scalar& alpha) {
  return serve(HookCall{kAddmm, keyset, a, b, &c, &beta, &alpha});
}

at::Tensor hook_bmm(c10::DispatchKeySet keyset, const at::Tensor& a, const at::Tensor& b) {
  return serve(HookCall{kBmm, keyset, a, b});
}

// Forgets every remembered route. Needs the GIL (it releases the replays).
void clear_routes() {
  std::lock_guard<std::mutex> guard(hooks.lock);
  for (Hook& hook : hooks.ops) {
    for (auto& entry : hook.routes) Py_XDECREF(entry.second.issue);
    hook.routes.clear();
  }
}

// Gives the ops back to torch's kernels and forgets the routes (nothing where not installed).
void remove_all_hooks() {
  hooks.libraries.clear();
  clear_routes();
  for (Hook& hook : hooks.ops) {
    Py_CLEAR(hook.python);
    hook.kept[0].reset();
    hook.kept[1].reset();
  }
}

// install_hooks(keys, mm, addmm, bmm): the hooks over torch's kernels at each dispatch key of
// `keys` ("CPU", "CUDA"), each op's unremembered calls going to its Python function.
PyObject* install_hooks(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject* keys;
  PyObject* functions[kHookOps];
  if (!PyArg_ParseTuple(args, "O!OOO", &PyTuple_Type, &keys, &functions[kMm],
                        &functions[kAddmm], &functions[kBmm])) {
    return nullptr;
  }
  remove_all_hooks();
  for (int op = 0; op < kHookOps; ++op) {
    Py_INCREF(functions[op]);
    hooks.ops[op].python = functions[op];
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); ++i) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(keys, i));
    if (name == nullptr) return nullptr;
    const bool cuda = std::strcmp(name, "CUDA") == 0;
    TORCH_CHECK(cuda || std::strcmp(name, "CPU") == 0, "install_hooks: no key ", name);
    const c10::DispatchKey key = cuda ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
    for (int op = 0; op < kHookOps; ++op) {
      auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(
          (std::string("aten::") + hook_names[op]).c_str(), "");
      hooks.ops[op].kept[cuda ? 1 : 0] = handle.getComputedKernelForDispatchKey(key);
    }
    auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key,
                                                    __FILE__, __LINE__);
    library->impl("mm", TORCH_FN(hook_mm));
    library->impl("addmm", TORCH_FN(hook_addmm));
    library->impl("bmm", TORCH_FN(hook_bmm));
    hooks.libraries.push_back(std::move(library));
  }
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyObject* remove_hooks(PyObject*, PyObject*) {
  HANDLE_TH_ERRORS
  remove_all_hooks();
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

HookOp hook_named(PyObject* name) {
  for (int op = 0; op < kHookOps; ++op) {
    if (PyUnicode_CompareWithASCIIString(name, hook_names[op]) == 0) return HookOp(op);
  }
  return kHookOps;
}

std::optional<c10::Scalar> scalar_of(PyObject* value) {
  if (PyBool_Check(value)) return c10::Scalar(value == Py_True);
  if (PyLong_Check(value)) {
    const long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return std::nullopt;
    return c10::Scalar(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(value)) return c10::Scalar(PyFloat_AS_DOUBLE(value));
  if (PyComplex_Check(value)) {
    return c10::Scalar(c10::complex<double>(PyComplex_RealAsDouble(value),
                                            PyComplex_ImagAsDouble(value)));
  }
  PyErr_SetString(PyExc_TypeError, "remember_route: beta and alpha must be numbers");
  return std::nullopt;
}

// remember_route(op, args, action, example): later calls of aten `op` with the signature of
// `args` (the call's arguments as the hook passed them to Python) take `action`: "torch" (the
// kept kernel) or issue (the replay into a new output like `example`). False where such calls
// cannot be remembered (a dispatch mode, `describe`) or already are.
PyObject* remember_route(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *name, *call_args, *action, *example;
  if (!PyArg_ParseTuple(args, "UO!OO", &name, &PyTuple_Type, &call_args, &action, &example)) {
    return nullptr;
  }
  const HookOp op = hook_named(name);
  const Py_ssize_t expected = op == kAddmm ? 5 : 2;
  if (op == kHookOps || PyTuple_GET_SIZE(call_args) != expected) {
    PyErr_Format(PyExc_ValueError, "remember_route: no aten op %R of %zd arguments", name,
                 PyTuple_GET_SIZE(call_args));
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < std::min<Py_ssize_t>(expected, 3); ++i) {
    if (!THPVariable_Check(PyTuple_GET_ITEM(call_args, i))) {
      PyErr_SetString(PyExc_TypeError, "remember_route: the op's tensors must be tensors");
      return nullptr;
    }
  }
  auto tensor_at = [&](Py_ssize_t i) -> const at::Tensor& {
    return THPVariable_Unpack(PyTuple_GET_ITEM(call_args, i));
  };
  std::optional<c10::Scalar> beta, alpha;
  if (op == kAddmm) {
    beta = scalar_of(PyTuple_GET_ITEM(call_args, 3));
    if (!beta) return nullptr;
    alpha = scalar_of(PyTuple_GET_ITEM(call_args, 4));
    if (!alpha) return nullptr;
  }
  const Py_ssize_t first = op == kAddmm ? 1 : 0;  // addmm(c, a, b, beta, alpha)
  HookCall call{op, c10::DispatchKeySet(), tensor_at(first), tensor_at(first + 1)};
  if (op == kAddmm) {
    call.bias = &tensor_at(0);
    call.beta = &*beta;
    call.alpha = &*alpha;
  }
  Route route;
  const bool torch_kernel = PyUnicode_Check(action) &&
                            PyUnicode_CompareWithASCIIString(action, "torch") == 0;
  if (!torch_kernel) {
    if (!PyCallable_Check(action) || !THPVariable_Check(example)) {
      PyErr_SetString(PyExc_TypeError, "remember_route: the action is \"torch\" or a callable "
                      "with a tensor as its example output");
      return nullptr;
    }
    const at::Tensor& out = THPVariable_Unpack(example);
    route.out_shape = out.sizes().vec();
    route.out_dtype = out.scalar_type();
    route.device = out.device();
  }
  std::string key;
  if (!hook_signature(call, key)) Py_RETURN_FALSE;
  std::lock_guard<std::mutex> guard(hooks.lock);
  auto& routes = hooks.ops[op].routes;
  if (routes.count(key)) Py_RETURN_FALSE;
  if (!torch_kernel) {
    Py_INCREF(action);
    route.issue = action;
  }
  routes.emplace(std::move(key), std::move(route));
  Py_RETURN_TRUE;
  END_HANDLE_TH_ERRORS
}

PyObject* routes_size(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> guard(hooks.lock);
  size_t n = 0;
  for (const Hook& hook : hooks.ops) n += hook.routes.size();
  return PyLong_FromSize_t(n);
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

// Forgets every remembered signature: the functions' and the hooks'.
PyObject* clear(PyObject*, PyObject*) {
  for (Function* fn : {&matmul_function, &linear_function}) {
    for (auto& entry : fn->actions) Py_XDECREF(entry.second.issue);
    fn->actions.clear();
  }
  clear_routes();
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
    {"clear", clear, METH_NOARGS, "Forget every remembered signature and route."},
    {"size", size, METH_NOARGS, "How many signatures are remembered."},
    {"install_hooks", install_hooks, METH_VARARGS, "install_hooks(keys, mm, addmm, bmm)"},
    {"remove_hooks", remove_hooks, METH_NOARGS, "Give mm, addmm and bmm back to torch."},
    {"remember_route", remember_route, METH_VARARGS,
     "remember_route(op, args, action, example) -> bool"},
    {"routes_size", routes_size, METH_NOARGS, "How many routes the hooks remember."},
    {nullptr, nullptr, 0, nullptr}};

#define TUNER_STRING(x) #x
#define TUNER_NAME(x) TUNER_STRING(x)
PyModuleDef module_def = {PyModuleDef_HEAD_INIT, TUNER_NAME(TORCH_EXTENSION_NAME), nullptr, -1,
                          methods};

}  // namespace

#define TUNER_JOIN(a, b) a##b
#define TUNER_INIT(name) TUNER_JOIN(PyInit_, name)
PyMODINIT_FUNC TUNER_INIT(TORCH_EXTENSION_NAME)() { return PyModule_Create(&module_def); }
