"""How VlccCheckpointEngine lays a training state out in its History: few, large chunks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vlcc_adjoint.lineage import History  # noqa: E402
from vlcc_adjoint.torch import VlccCheckpointEngine  # noqa: E402
from vlcc_adjoint.torch._deepspeed import CHUNK_BYTES  # noqa: E402


@pytest.mark.parametrize("wait_on_commit", ["captured", "written"])
def test_engine_writes_large_chunks_and_reads_histories_of_any_chunk_size(tmp_path, wait_on_commit):
    assert CHUNK_BYTES == 16 << 20
    torch.manual_seed(3)
    weight = torch.randn(2560, 4096)  # 40 MiB: three chunks of at most 16 MiB
    state = {"module": {"w": weight, "b": torch.randn(7)}, "global_steps": 5}
    engine = VlccCheckpointEngine(tmp_path / "h", wait_on_commit=wait_on_commit)
    engine.save(state, str(tmp_path / "big.pt"))
    small = VlccCheckpointEngine(tmp_path / "h", chunk_bytes=1 << 20)
    small.save(state, str(tmp_path / "small.pt"))
    engine.close()
    small.close()
    with History(tmp_path / "h", mode="r") as h:
        big_v = VlccCheckpointEngine.read_pointer(str(tmp_path / "big.pt"))["version"]
        small_v = VlccCheckpointEngine.read_pointer(str(tmp_path / "small.pt"))["version"]
        big = {leaf.path: leaf for leaf in h.leaves(big_v)}
        fine = {leaf.path: leaf for leaf in h.leaves(small_v)}
    w = next(k for k, leaf in big.items() if leaf.shape == (2560, 4096))
    assert big[w].chunks == 3 and big[w].codec is None
    assert fine[w].chunks == 40
    reader = VlccCheckpointEngine()
    for name in ("big.pt", "small.pt"):
        got = reader.load(str(tmp_path / name))
        np.testing.assert_array_equal(got["module"]["w"].numpy(), weight.numpy())
        np.testing.assert_array_equal(got["module"]["b"].numpy(), state["module"]["b"].numpy())
        assert got["global_steps"] == 5
    reader.close()
