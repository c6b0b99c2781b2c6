"""The interface's sources shipped in the package, and the numbers of ``vlcc.h``.

``vlcc.h`` is the one definition of the interface's numbers (the answers
``VLCC_ADVANCE`` ... ``VLCC_DONE``, the return codes ``VLCC_OK`` and
``VLCC_E_...``, ``VLCC_VERSION_SIZE``); the Python side reads them from the
header (:func:`constant`) rather than keeping a copy.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ..errors import VlccRuntimeError

__all__ = ["FORTRAN_SOURCE", "HEADER", "SOURCE", "constant"]

_HERE = Path(__file__).resolve().parent

#: The C header ``vlcc.h``: the interface, and the one definition of its numbers.
HEADER = _HERE / "vlcc.h"

#: The C library's source ``vlcc.c`` (``libvlcc``, built by :func:`~vlcc_adjoint.capi.build`).
SOURCE = _HERE / "vlcc.c"

#: The Fortran module's source ``vlcc.f90`` (``module vlcc``, built with ``--fflags``).
FORTRAN_SOURCE = _HERE / "vlcc.f90"

# ``NAME = 12`` inside an enum, or ``#define NAME 12``.
_NUMBER = re.compile(r"\b(VLCC_[A-Z0-9_]+)\s*=\s*(-?\d+)\b|#define\s+(VLCC_[A-Z0-9_]+)\s+(-?\d+)\b")


@functools.cache
def _constants() -> dict[str, int]:
    found: dict[str, int] = {}
    for m in _NUMBER.finditer(HEADER.read_text()):
        name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        found[name] = int(value)
    return found


def constant(name: str) -> int:
    """The value of the enum constant or numeric macro `name` of ``vlcc.h``."""
    try:
        return _constants()[name]
    except KeyError:
        raise VlccRuntimeError(
            f"vlcc.h ({HEADER}) defines no {name}; the installation is damaged: reinstall "
            "vlcc-adjoint"
        ) from None
