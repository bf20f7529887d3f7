"""The one compiled helper, ``storage._framing`` (see storage/_framing.c). Everything else is
in pyproject.toml. The build is optional: without a C compiler and Python's headers runnel
installs and runs with the pure-Python walk, and the broker logs which one it uses."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("storage._framing", ["storage/_framing.c"], optional=True)])
