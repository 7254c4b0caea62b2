"""numba-cuda-workbench: ladders of numba.cuda kernels, checked and measured.

Importing this package decides, before numba is imported, whether kernels run on a real GPU or in
numba's CUDA simulator (see ``workbench.device``). Import ``workbench`` (or a ``solutions`` module,
which imports it) before anything that imports numba.
"""

from .device import choose_mode as _choose_mode

MODE = _choose_mode()

if MODE == "sim":
    # Fill the simulator's gaps (warp intrinsics, launch limits, garbage shared memory) before any
    # kernel runs.
    from .simulator import install as _install_simulator

    _install_simulator()
elif MODE == "compile":
    from .device import install_compile_target as _install_compile_target

    _install_compile_target()

__version__ = "0.1.0"
__all__ = ["MODE", "__version__"]
