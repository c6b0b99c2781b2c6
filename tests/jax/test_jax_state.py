"""The JAX leaf provider: JAX arrays and PRNG keys as vlcc states.

Referee for ``describe``: what ``to_numpy`` returns (dtype, shape, spec
fields), which is what a store holds.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from vlcc_adjoint.jax._state import PROVIDER, host_aval, leaf_nbytes  # noqa: E402
from vlcc_adjoint.state import Structure, flatten, state_nbytes  # noqa: E402

ARRAYS = {
    "float32 matrix": lambda: jnp.ones((2, 3), jnp.float32),
    "int32 scalar": lambda: jnp.asarray(7, jnp.int32),
    "bool vector": lambda: jnp.zeros(4, bool),
    "empty": lambda: jnp.zeros((0, 5)),
    "typed key": lambda: jax.random.key(0),
    "typed keys": lambda: jax.random.split(jax.random.key(1), 3),
    "raw key": lambda: jax.random.PRNGKey(2),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_describe_says_what_to_numpy_returns(name):
    x = ARRAYS[name]()
    arr, fields = PROVIDER.to_numpy(x)
    assert PROVIDER.describe is not None
    dtype, shape, described = PROVIDER.describe(x)
    assert (np.dtype(dtype), tuple(shape), described) == (arr.dtype, arr.shape, fields)


def test_structure_and_bytes_of_a_jax_state_read_no_data():
    """A deleted array has no data left to read, only its metadata: the
    structure and byte count of a state holding one still come out."""
    state = {"u": jnp.ones((3, 4)), "key": jax.random.key(0), "k": jnp.asarray(1, jnp.int32)}
    expected = Structure.of(state)
    nbytes = sum(leaf.nbytes for leaf in flatten(state)[0])
    for x in jax.tree.leaves(state):
        x.delete()
    with pytest.raises(RuntimeError):
        flatten(state)  # the data is gone ...
    assert Structure.of(state) == expected  # ... its description is not
    assert state_nbytes(state) == nbytes == expected.nbytes


@pytest.mark.parametrize("name", list(ARRAYS))
def test_host_aval_and_bytes_are_what_to_numpy_returns_also_of_abstract_values(name):
    """The host's view of a leaf (a PRNG key's key data) from an array or
    from its abstract value alone (traced shapes, residuals of eval_shape)."""
    x = ARRAYS[name]()
    arr, _ = PROVIDER.to_numpy(x)
    for value in (x, jax.ShapeDtypeStruct(x.shape, x.dtype)):
        aval = host_aval(value)
        assert (np.dtype(aval.dtype), tuple(aval.shape)) == (arr.dtype, arr.shape)
        assert leaf_nbytes(value) == arr.nbytes
