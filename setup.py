"""The one thing pyproject.toml cannot say: the C extensions, built when they can be
(runtime/_kernels.c: hashing and routing columns; worker/_loop.c: a batch's record loop;
runtime/flows/_steps.c: a flow's process step).

``optional=True``: on a machine without a C compiler or Python's headers the build of an
extension fails with a warning and millstream installs without it; runtime/kernels.py,
worker/recordloop.py and runtime/flows/steps.py then run their pure-Python references
(slower, same answers).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(name, [source], optional=True, extra_compile_args=["-O3"],
                             depends=["runtime/_ccore.h"])  # (what _loop.c and _steps.c share)
                   for name, source in (("runtime._kernels", "runtime/_kernels.c"),
                                        ("worker._loop", "worker/_loop.c"),
                                        ("runtime.flows._steps", "runtime/flows/_steps.c"))])
