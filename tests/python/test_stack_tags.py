"""Tests of python/stowage/stack_tags.py: the tag of a recorded stack, tier by tier.

The stacks are built as torch.cuda.memory._dump_snapshot() records them (a trace entry's
'frames': dicts with 'filename', 'line' and 'name', innermost first), in its two shapes: Python
frames only (stacks="python") and C++ frames first (stacks="all": the allocator's own C++
frames, the dispatcher, the interpreter, then the Python frames).
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from stowage import stack_tags  # noqa: E402
from stowage.stack_tags import UNKNOWN, python_kind, stack_tag  # noqa: E402

SITE = "/opt/conda/lib/python3.10/site-packages/"


def fr(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


# The C++ frames PyTorch records above every allocation (stacks="all"), innermost first.
ALLOCATOR = [
    fr("??", 0, "torch::unwind::unwind()"),
    fr("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    fr("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    fr("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::"
       "DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
    fr("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::"
       "allocate(unsigned long)"),
    fr("", 0, "at::TensorBase at::detail::_empty_strided_generic<c10::ArrayRef<long> >("
       "c10::ArrayRef<long>, c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet)"),
    fr(SITE + "torch/lib/libtorch_cuda.so", 0, "??"),
    fr("RegisterCUDA.cpp", 0, "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::"
       "WrapFunctionIntoFunctor_<at::Tensor (at::Tensor const&)> >::call("
       "c10::OperatorKernel*, c10::DispatchKeySet, at::Tensor const&)"),
    fr("python_variable_methods.cpp", 0,
       "torch::autograd::THPVariable_to(_object*, _object*, _object*)"),
    fr("??", 0, "(anonymous namespace)::THPFunction_apply(_object*, _object*)"),
]
# The interpreter and the C++ standard library between the C++ and the Python frames.
INTERPRETER = [
    fr("/usr/local/src/conda/python-3.10.16/Objects/descrobject.c", 344,
       "method_vectorcall_VARARGS_KEYWORDS"),
    fr("??", 0, "_PyEval_EvalFrameDefault"),
    fr("/opt/conda/conda-bld/gcc/libstdc++-v3/src/c++11/thread.cc", 82,
       "execute_native_thread_routine"),
    fr("", 0, "std::_Function_handler<void (), std::function<void ()> >::_M_invoke("
       "std::_Any_data const&)"),
]
MODEL = [
    fr(SITE + "torch/nn/functional.py", 2573, "layer_norm"),
    fr(SITE + "torch/nn/modules/module.py", 1527, "_call_impl"),
    fr("/home/u/proj/model.py", 54, "forward"),
    fr(SITE + "torch/nn/modules/module.py", 1518, "_wrapped_call_impl"),
    fr("/home/u/proj/train.py", 30, "main"),
    fr("/opt/conda/lib/python3.10/runpy.py", 86, "_run_code"),
]
# The autograd engine's thread: no Python frame at all.
ENGINE = [
    fr("??", 0, "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
    fr("??", 0, "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor, "
       "std::allocator<at::Tensor> >&&)"),
    fr("", 0, "torch::autograd::Node::operator()(std::vector<at::Tensor, "
       "std::allocator<at::Tensor> >&&)"),
    fr("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<"
       "torch::autograd::GraphTask> const&)"),
    fr("thread48.o", 0, "execute_native_thread_routine"),
    fr("??", 0, "start_thread"),
    fr("", 0, "__clone3"),
]


class Tiers(unittest.TestCase):
    def test_python_only_stack_names_the_users_line(self):
        self.assertEqual(stack_tag(MODEL), ("/home/u/proj/model.py:54 forward", "user"))

    def test_cpp_frames_first_name_the_same_line(self):
        stack = ALLOCATOR + INTERPRETER + MODEL
        self.assertEqual(stack_tag(stack), ("/home/u/proj/model.py:54 forward", "user"))
        # memory_snapshot.cpp is outside '/torch/' but is torch's: never the tag
        self.assertNotIn("memory_snapshot.cpp", stack_tag(stack[2:])[0])

    def test_installed_package_between_user_and_torch_follows_after_via(self):
        stack = [fr(SITE + "torch/functional.py", 407, "einsum"),
                 fr(SITE + "einops/_backends.py", 288, "einsum"),
                 fr(SITE + "einops/einops.py", 916, "einsum"),
                 fr("/home/u/proj/layers.py", 22, "forward")] + MODEL[1:]
        self.assertEqual(stack_tag(ALLOCATOR + stack),
                         ("/home/u/proj/layers.py:22 forward via %seinops/_backends.py:288 einsum"
                          % SITE, "user"))
        # a package frame further out than the user's one is not named
        outer = MODEL + [fr(SITE + "ipykernel/kernelbase.py", 437, "dispatch_shell")]
        self.assertEqual(stack_tag(outer)[0], "/home/u/proj/model.py:54 forward")

    def test_package_when_no_user_frame(self):
        stack = ALLOCATOR + [
            fr(SITE + "torch/nn/modules/linear.py", 114, "forward"),
            fr(SITE + "transformers/models/llama/modeling_llama.py", 216, "forward"),
            fr(SITE + "torch/nn/modules/module.py", 1527, "_call_impl"),
            fr(SITE + "accelerate/hooks.py", 166, "new_forward"),
            fr("/opt/conda/lib/python3.10/runpy.py", 86, "_run_code")]
        self.assertEqual(stack_tag(stack), (
            SITE + "transformers/models/llama/modeling_llama.py:216 forward", "package"))

    def test_first_python_frame_when_only_torch_and_the_standard_library(self):
        stack = ALLOCATOR + INTERPRETER + [
            fr(SITE + "torch/nn/modules/module.py", 1355, "convert"),
            fr(SITE + "torch/nn/modules/module.py", 955, "_apply"),
            fr("/opt/conda/lib/python3.10/threading.py", 953, "run")]
        self.assertEqual(stack_tag(stack),
                         (SITE + "torch/nn/modules/module.py:1355 convert", "python"))
        self.assertEqual(stack_tag([fr("<frozen runpy>", 88, "_run_code")]),
                         ("<frozen runpy>:88 _run_code", "python"))

    def test_autograd_node_when_no_python_frame(self):
        self.assertEqual(stack_tag(ALLOCATOR + ENGINE), (
            "??:0 torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor, "
            "std::allocator<at::Tensor> >&&)", "backward"))
        acc = fr("??", 0, "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, "
                 "std::allocator<at::Tensor> >&&)")
        self.assertEqual(stack_tag(ALLOCATOR + [acc] + ENGINE[2:])[1], "backward")

    def test_cpp_frame_outside_the_skipped_libraries(self):
        ext = fr("fused_attention.cu", 88,
                 "void my_ext::launch_attention<float>(float*, at::Tensor const&)")
        self.assertEqual(stack_tag(ALLOCATOR + [ext] + INTERPRETER),
                         ("fused_attention.cu:88 void my_ext::launch_attention<float>("
                          "float*, at::Tensor const&)", "native"))
        plain = fr("flash_api.cpp", 0, "mha_fwd(at::Tensor&, at::Tensor const&)")
        self.assertEqual(stack_tag(ALLOCATOR + INTERPRETER + [plain])[1], "native")
        # the autograd node comes first when both are there
        self.assertEqual(stack_tag(ALLOCATOR + [ext] + ENGINE)[1], "backward")

    def test_unknown_when_every_frame_is_skipped(self):
        self.assertEqual(stack_tag(ALLOCATOR + INTERPRETER), (UNKNOWN, "unknown"))
        self.assertEqual(stack_tag(ALLOCATOR + ENGINE[2:]), (UNKNOWN, "unknown"))
        self.assertEqual(stack_tag([5, "x", None]), (UNKNOWN, "unknown"))

    def test_no_frames_no_tag(self):
        for frames in (None, [], (), "model.py", 7, {"filename": "a.py"}):
            self.assertEqual(stack_tag(frames), (None, None), frames)

    def test_the_tag_is_one_line(self):
        tag, _ = stack_tag([fr("  /home/u/a\nb.py", 3, "f\r\0g")])
        self.assertEqual(tag, "/home/u/a b.py:3 f  g")
        self.assertEqual(stack_tag([{"filename": "m.py"}]), ("m.py:? ?", "user"))


class Kinds(unittest.TestCase):
    def test_python_files(self):
        cases = {
            SITE + "torch/nn/modules/module.py": "torch",
            r"D:\Dev\a\.venv\Lib\site-packages\torch\nn\modules\module.py": "torch",
            "/tmp/torchinductor_me/ab/cabc.py": "torch",
            "<eval_with_key>.3": "torch",
            "/opt/conda/lib/python3.10/runpy.py": "stdlib",
            "/usr/lib64/python3.9/threading.py": "stdlib",
            "<frozen importlib._bootstrap>": "stdlib",
            r"C:\Python310\Lib\copy.py": "stdlib",
            r"C:\Users\z\uv\python\cpython-3.10.19-windows-x86_64-none\lib\copy.py": "stdlib",
            SITE + "einops/einops.py": "package",
            "/usr/lib/python3/dist-packages/numpy/core/numeric.py": "package",
            r"D:\Dev\a\.venv\Lib\site-packages\einops\einops.py": "package",
            "/home/u/proj/model.py": "user",
            "/mnt/proj/lib/transformers/models/bert/modeling_bert.py": "user",
            "/home/u/Lib/x.py": "user",
            "/tmp/ipykernel_114/3105878423.py": "user",
            "<stdin>": "user",
            "/home/u/torch_geometric_demo/train.py": "user",
        }
        for fn, want in cases.items():
            self.assertEqual(python_kind(fn.replace("\\", "/")), want, fn)

    def test_cpp_names_of_the_skipped_libraries(self):
        for name in ("torch::jit::run(int)", "at::native::add(at::Tensor const&)",
                     "c10::impl::call<int>(int)", "void std::__invoke_impl<void>(int)",
                     "pybind11::cpp_function::dispatcher(_object*)",
                     "cudnn::backend::execute(int)", "void cutlass::Kernel<int>(int)",
                     "(anonymous namespace)::pythonFallback(c10::OperatorHandle const&)",
                     "THPFunction_apply(_object*, _object*)",
                     "at::Tensor at::native::(anonymous namespace)::f(int)",
                     "c10::impl::Wrap<int>::operator()(at::Tensor const&)",
                     "cfunction_call", "_PyEval_EvalFrameDefault", "clone", "??", ""):
            self.assertEqual(stack_tag([fr("??", 0, name)]), (UNKNOWN, "unknown"), name)
        for name in ("my_ext::forward(at::Tensor const&)", "at::Tensor my_ext::f(int)",
                     "mha_fwd(at::Tensor&)", "xformers::ops::(anonymous namespace)::g(int)"):
            self.assertEqual(stack_tag([fr("??", 0, name)])[1], "native", name)
        self.assertIn("cudnn", stack_tags.SKIPPED_NAMESPACES)

if __name__ == "__main__":
    unittest.main()
