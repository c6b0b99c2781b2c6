"""The Devito adapter, run in an interpreter of its own.

Devito's generated operators switch the calling thread's floating-point unit
to flush-to-zero / denormals-are-zero (``_MM_SET_FLUSH_ZERO_MODE``) and never
switch it back, so after one operator call every later test in the process
would see subnormal numbers vanish.  The cases live in ``devito_cases.py``
(the adapter against Devito's store-everything gradient) and
``devito_peer_cases.py`` (Devito's own checkpointing scenarios, against
pyrevolve) and run here in a fresh Python, with their own pytest report on
failure.
"""

import importlib.util
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("devito") is None,
    reason="devito is an optional extra: pip install '.[devito]'",
)


@pytest.mark.parametrize("cases", ["devito_cases.py", "devito_peer_cases.py"])
def test_devito_adapter_cases_pass_in_their_own_process(cases):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / cases)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1]
