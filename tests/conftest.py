"""Fixtures shared by several test modules, and the session's temporary directory.

The suite leaves nothing behind: the session runs with ``TMPDIR`` at a
folder of its own (``vlcc-tests-*`` in the system's temporary directory),
so that whatever a test, the package or a script started by a test creates
there is seen, and nothing another process creates is.  At the end the
folder must be empty; if it is not, the session fails and lists what was
left (the folder is removed either way).  pytest's own ``tmp_path``
folders stay where pytest keeps them (``PYTEST_DEBUG_TEMPROOT`` points at
the original temporary directory), with their usual retention.
"""

import getpass
import os
import shutil
import socket
import tempfile

import pytest

#: Caches that libraries keep in the temporary directory across runs, by
#: design, as ``{environment variable: folder name}``: they stay in the
#: original temporary directory, where the library would put them.
CACHES = {
    # torch.compile's kernels (imported by DeepSpeed); torch's own default
    "TORCHINDUCTOR_CACHE_DIR": f"torchinductor_{getpass.getuser()}",
}

#: Caches that libraries keep in the temporary directory under fixed names,
#: with no setting to move them: links in the session's folder point at them
#: in the original temporary directory, where they persist across sessions.
LINKED_CACHES = (
    f"devito-jitcache-uid{os.getuid()}",  # Devito's compiled operators
    f"devito-codepy-uid{os.getuid()}",  # and their generated code
)

#: The session's TMPDIR, the environment it replaced, and what was left in it.
_SESSION_TMP = pytest.StashKey[dict]()


def pytest_configure(config):
    original = tempfile.gettempdir()
    names = ("TMPDIR", "PYTEST_DEBUG_TEMPROOT", *CACHES)
    saved = {name: os.environ.get(name) for name in names}
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", original)
    for variable, folder in CACHES.items():
        os.environ.setdefault(variable, os.path.join(original, folder))
    folder = tempfile.mkdtemp(prefix="vlcc-tests-", dir=original)
    for name in LINKED_CACHES:
        os.makedirs(os.path.join(original, name), mode=0o700, exist_ok=True)
        os.symlink(os.path.join(original, name), os.path.join(folder, name))
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    config.stash[_SESSION_TMP] = {"folder": folder, "saved": saved, "left": []}


def _left_in(folder: str) -> list[str]:
    """What is in `folder`: each entry, a directory with the number of files
    under it (links are not followed)."""
    found = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name in LINKED_CACHES and entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            files = sum(len(f) for _, _, f in os.walk(entry.path))
            found.append(f"{entry.name}/ ({files} files)")
        else:
            found.append(entry.name)
    return found


def pytest_sessionfinish(session, exitstatus):
    info = session.config.stash.get(_SESSION_TMP, None)
    if info is None:
        return
    folder = info["folder"]
    info["left"] = _left_in(folder)
    for name, value in info["saved"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None
    shutil.rmtree(folder, ignore_errors=True)
    if info["left"] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    info = terminalreporter.config.stash.get(_SESSION_TMP, None)
    if not info or not info["left"]:
        return
    left = info["left"]
    terminalreporter.section("files left in TMPDIR", sep="=", red=True, bold=True)
    terminalreporter.line(
        f"the session ran with TMPDIR={info['folder']} and left {len(left)} entries there "
        "(now removed); what a run creates for itself, it removes (tests: use tmp_path):"
    )
    for name in left[:50]:
        terminalreporter.line(f"  {name}")
    if len(left) > 50:
        terminalreporter.line(f"  ... and {len(left) - 50} more")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ds_env():
    """The environment of a one-process DeepSpeed group on gloo (CPU).

    The process group outlives the module: DeepSpeed's comm layer keeps the
    first one it saw, so a group destroyed here would break the next module
    that initialises DeepSpeed.  DeepSpeed's first ``initialize`` on a CPU
    machine compiles a shared-memory all-reduce op for minutes; one process
    never uses it, so it is marked incompatible for the module's duration.
    """
    deepspeed = pytest.importorskip("deepspeed")
    old = dict(os.environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )  # the port serves the first group only
    saved = deepspeed.ops.__compatible_ops__.get("deepspeed_shm_comm")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    yield
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = saved
    os.environ.clear()
    os.environ.update(old)


@pytest.fixture
def x64():
    """JAX in float64 for one test.  The global flag, not the thread-local
    ``jax.enable_x64`` context: host callbacks run on XLA's threads and must
    see float64 too."""
    jax = pytest.importorskip("jax")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)
