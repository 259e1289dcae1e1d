"""The one thing pyproject.toml cannot say: runtime/_kernels.c, built when it can be.

``optional=True``: on a machine without a C compiler or Python's headers the build of the
extension fails with a warning and millstream installs without it; runtime/kernels.py then
runs its pure-Python reference of the same functions (slower, same answers).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("runtime._kernels", ["runtime/_kernels.c"], optional=True,
                             extra_compile_args=["-O3"])])
