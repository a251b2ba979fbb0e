"""The C extension only; everything else is in pyproject.toml.

It is optional: where it cannot be compiled the package installs without it and
runs the same code in Python (``nvrx.straggler.sections.HOT_PATH`` says which).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nvrx.straggler._hotpath",
            sources=["src/nvrx/straggler/_hotpath.c"],
            optional=True,
        )
    ]
)
