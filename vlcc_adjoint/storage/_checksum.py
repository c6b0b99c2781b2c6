"""Per-leaf integrity checksums: xxh3-64 of the leaf's bytes.

Why xxh3-64: it detects the failures a checkpoint store meets (a flipped
bit, a torn or truncated write, a chunk file from another record) with
probability 1 - 2^-64, and it is fast enough to check on every ``get``.  It
is not a cryptographic hash: it protects against accidents, not against an
attacker who can write to the store.

Two implementations of the *same* function (bit-identical digests, checked
by ``tests/test_tiers.py`` against the ``xxhash`` package for every length
class and alignment, so the stored format, 16 hexadecimal digits, is
unchanged and records written before still verify):

* ``xxhash`` (C): ~40 GB/s in cache on this VM, but it holds the GIL while
  it hashes.  Used for leaves below :data:`KERNEL_MIN_BYTES`, and wherever
  the kernel is not available.
* Our kernel: XXH3's long-input loop written in LLVM IR with explicit
  ``<8 x i64>`` vectors (one 64-byte stripe per register: load, xor with
  the secret, one ``vpmuludq``, a lane swap, two adds), compiled once per
  process by llvmlite (numba's LLVM binding; ~0.1-0.3 s, at the first large
  leaf) and called through ctypes, which releases the GIL.  The arrays are
  passed as objects and the kernel reads their data pointers itself (asking
  numpy for an address costs more than the call).  Three entry points:
  hash only (:func:`leaf_checksum`, about as fast as ``xxhash``), and
  :func:`copy_checksum`, which copies a leaf and hashes it in the *same
  pass*: the source is read once and the hash rides on the copy's memory
  traffic, so the store's capture (``save``) and restore (``load``) each
  cost one pass instead of two.  The capture writes leaves of
  :data:`STREAM_MIN_BYTES` and more with streaming (non-temporal) stores:
  a checkpoint is not read again soon, so writing it neither reads the
  buffer's old contents first nor evicts the solver's working set from the
  caches.

Why hand-written IR and not a numba kernel: numba's version of the same
loop (eight scalar lanes) ran at 12-17 GB/s, because LLVM's loop vectoriser
vectorises it *across* stripes and then spends most of its time
transposing them.  The copy's plain stores are ``volatile`` so that LLVM
does not split them back out into a ``memcpy`` call per block (that version
cost 1.2-1.3x a copy).  Per leaf, microseconds, median of 100-300 calls
on the same two buffers (so partly in cache), shared 2-core VM (AVX-512),
load average 3:

  ========  =========  ========  ==============  ============  ============  ===========
  leaf      np.copyto  xxh3 (C)  copyto + xxh3   fused         streamed      kernel hash
  ========  =========  ========  ==============  ============  ============  ===========
  64 KiB    1.7        1.3       3.2 (1.9x)      3.4 (2.0x)    3.4           2.3
  1.44 MB   80-84      26-27     104-106 (1.3x)  86-88 (1.05x) 73 (0.9x)     33
  16 MiB    1170-1230  595-620   ~1800 (1.5x)    1280-1480     1285-1320     690-760
                                                 (1.1-1.2x)    (1.1x)
  ========  =========  ========  ==============  ============  ============  ===========

(``copyto + xxh3`` at 16 MiB: the sum of its parts; measured back to back
it came out between 2040 and 5920.  A numba ``nogil`` version of the
kernel, for the record: 4.4 us at 64 KiB, 125 us at 1.44 MB, 1380 us at 16
MiB.)  Below :data:`KERNEL_MIN_BYTES` the call's fixed cost (~1.5 us)
outweighs the saved pass, so small leaves take ``np.copyto`` + ``xxhash``.
``benchmarks/bench_store_calls.py`` measures the same paths on data that is
*not* in cache, as in a run (its part 0), and what a whole ``save`` and
``load`` cost against ``np.copyto``.  The kernel needs a little-endian host
and LLVM; anything else falls back to ``np.copyto`` + ``xxhash``, with the
same results.
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
import threading

import numpy as np
import xxhash

from ..state import _SLICE, byte_view
from ._tier import CorruptCheckpointError, Record, TierFullError, check_key

__all__ = ["bytes_checksum", "copy_checksum", "leaf_checksum"]

_HEX16 = re.compile(r"[0-9a-f]{16}")
# One encoder, built once: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))

#: Leaves at least this large are hashed (and copied) by the kernel; below
#: it the call's fixed cost (~1.5 us) outweighs the pass it saves.
KERNEL_MIN_BYTES = 128 << 10
#: ``copy_checksum(stream=True)`` streams leaves at least this large: a
#: capture that size would push the solver's working set out of a 2 MiB L2
#: and pay a read for ownership of every destination line.  Measured in
#: ``run_adjoint`` of the seismic example (Revolve, 32 snapshots, paired
#: runs in one process): streaming 2 MiB leaves (512^2 grid) cut the store
#: calls' time by 15% and the gradient's by 5%, 1.1 MiB leaves (384^2) by 8%
#: and 4%; 720 KB leaves (300^2) captured ~10% slower streamed, so smaller
#: leaves are written through the caches.
STREAM_MIN_BYTES = 1 << 20


def bytes_checksum(data) -> str:
    """xxh3-64 of a bytes-like object, as 16 hexadecimal characters."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if len(view) <= _SLICE:
        return xxhash.xxh3_64_hexdigest(view)
    h = xxhash.xxh3_64()
    for start in range(0, len(view), _SLICE):
        h.update(view[start:start + _SLICE])
    return h.hexdigest()


def leaf_checksum(arr: np.ndarray) -> str:
    """xxh3-64 of a C-contiguous array's bytes (16 hexadecimal characters).

    Only the bytes are hashed; dtype and shape are checked against the
    record's metadata separately.  Large leaves are hashed with the GIL
    released (the kernel), so a worker thread hashing does not stop the
    caller's thread.
    """
    if not arr.flags.c_contiguous:
        raise ValueError("leaf_checksum needs a C-contiguous array")
    n = arr.nbytes
    if n >= KERNEL_MIN_BYTES and _LITTLE:
        kernels = _KERNELS or _build()
        if kernels:
            return f"{kernels[1](arr, arr, n):016x}"
    if n <= _SLICE:
        try:  # numpy hands xxhash its contiguous buffer directly
            return xxhash.xxh3_64_hexdigest(arr)
        except (BufferError, TypeError, ValueError):
            pass
    return bytes_checksum(byte_view(arr))


def copy_checksum(src: np.ndarray, dst: np.ndarray, *, stream: bool = False) -> str:
    """Copy `src` into `dst` and return xxh3-64 of the bytes copied.

    Equal to ``np.copyto(dst, src); leaf_checksum(dst)``, in one pass over
    `src` for leaves of :data:`KERNEL_MIN_BYTES` and more.

    **Arguments:**

    - `src`: a C-contiguous array.
    - `dst`: a C-contiguous, writeable array of the same dtype and shape
      that does not overlap `src`.
    - `stream`: write `dst` with non-temporal stores (from
      :data:`STREAM_MIN_BYTES`): for a copy nobody reads soon (a capture),
      which then neither waits for `dst`'s old contents nor evicts the
      caller's working set from the caches.
    """
    n = src.nbytes
    if n >= KERNEL_MIN_BYTES and _LITTLE and src.dtype == dst.dtype and src.shape == dst.shape \
            and src.flags.c_contiguous and dst.flags.c_contiguous and dst.flags.writeable:
        kernels = _KERNELS or _build()
        if kernels:
            k = kernels[2] if stream and n >= STREAM_MIN_BYTES else kernels[0]
            return f"{k(src, dst, n):016x}"
    np.copyto(dst, src, casting="no")
    return leaf_checksum(dst)


# -- the kernel: XXH3-64 of long inputs (> 240 bytes), default secret, seed 0 -----
#
# Y. Collet, xxHash, XXH3 (xxhash.h v0.8, XXH3_hashLong_64b_default).  The
# input is read in 64-byte stripes, one <8 x i64> vector each; stripe s of
# a 1024-byte block is mixed into the eight 64-bit lanes with secret words
# s..s+7:
#     k = d ^ secret[s:s+8];  acc += swap_pairs(d) + lo32(k) * hi32(k)
# (lo32 * hi32 of 64-bit lanes is one vpmuludq).  After each full block the
# lanes are scrambled with secret words 16..23; the last, partial block
# stops one stripe short and the final 64 bytes are mixed in again with the
# secret at byte 121; the lanes are folded pairwise with 128-bit products
# against the secret at byte 11, then avalanched.

_LITTLE = sys.byteorder == "little"
_SECRET = bytes.fromhex(  # XXH3_kSecret
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64_1, _P64_2, _P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P64_4, _P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
_INIT_ACC = (_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1)
_AVALANCHE = 0x165667919E3779F9

_KERNELS = None  # (copy, hash, stream) once built: f(src, dst, nbytes); () if unavailable
_ENGINE = None  # keeps the compiled code alive
_BUILD_LOCK = threading.Lock()


def _i64(v: int) -> str:
    """`v` as an LLVM i64 literal (two's complement: IR literals are signed)."""
    v &= (1 << 64) - 1
    return str(v - (1 << 64) if v >> 63 else v)


def _secret_words(offset: int, count: int) -> list[int]:
    return [int(w) for w in np.frombuffer(_SECRET, "<u8", count=count, offset=offset)]


def _vector(values) -> str:
    return "<" + ", ".join(f"i64 {_i64(v)}" for v in values) + ">"


_SWAP_PAIRS = "<8 x i32> <" + ", ".join(f"i32 {i ^ 1}" for i in range(8)) + ">"  # lane i <- i ^ 1


def _accumulate(tag: str, data: str, key: str, acc: str) -> str:
    """IR for one stripe: ``%{tag}acc = acc + swap_pairs(data) + lo32(k) * hi32(k)``."""
    return f"""
  %{tag}k = xor <8 x i64> {data}, {key}
  %{tag}lo = and <8 x i64> %{tag}k, {_vector([0xFFFFFFFF] * 8)}
  %{tag}hi = lshr <8 x i64> %{tag}k, {_vector([32] * 8)}
  %{tag}mul = mul <8 x i64> %{tag}lo, %{tag}hi
  %{tag}swap = shufflevector <8 x i64> {data}, <8 x i64> poison, {_SWAP_PAIRS}
  %{tag}sum = add <8 x i64> {acc}, %{tag}swap
  %{tag}acc = add <8 x i64> %{tag}sum, %{tag}mul"""


def _kernel_ir(name: str, copy: bool, stream: bool = False) -> str:
    """``i64 name(ptr src, ptr dst, i64 len)``: xxh3-64 of the `len` bytes at
    `src` (more than 240, any alignment), copying them to `dst` if `copy`,
    with streaming stores if `stream` and `dst` is 16-byte aligned."""
    store = """
  %q = getelementptr inbounds i8, ptr %dst, i64 %off
  store volatile <8 x i64> %d, ptr %q, align 1""" if copy else ""
    if stream:  # four 16-byte streaming stores (64-byte ones need 64-byte alignment)
        store = """
  %q = getelementptr inbounds i8, ptr %dst, i64 %off""" + "".join(f"""
  %d{j} = shufflevector <8 x i64> %d, <8 x i64> poison, <2 x i32> <i32 {2 * j}, i32 {2 * j + 1}>
  %q{j} = getelementptr inbounds i8, ptr %q, i64 {16 * j}
  store <2 x i64> %d{j}, ptr %q{j}, align 16, !nontemporal !0""" for j in range(4))
    # A streaming copy needs a 16-byte-aligned destination: else the plain one.
    entry = f"""
  %dint = ptrtoint ptr %dst to i64
  %dmis = and i64 %dint, 15
  %daligned = icmp eq i64 %dmis, 0
  br i1 %daligned, label %start, label %plain
plain:
  %pr = tail call i64 @{name.replace("_stream", "_copy")}(ptr %src, ptr %dst, i64 %len)
  ret i64 %pr
start:""" if stream else """
  br label %start
start:"""
    # Streaming stores are weakly ordered: fence them before anyone may look.
    fence = """
  call void @llvm.x86.sse.sfence()""" if stream else ""
    # The bytes after the last whole stripe of the last block (its final
    # stripe is hashed below, from the end of the input).
    rest = """
  %rp = getelementptr inbounds i8, ptr %src, i64 %done
  %rq = getelementptr inbounds i8, ptr %dst, i64 %done
  %rlen = sub i64 %len, %done
  call void @llvm.memcpy.p0.p0.i64(ptr %rq, ptr %rp, i64 %rlen, i1 false)""" if copy else ""
    merge, h = [], "%h0"
    for i in range(4):
        merge.append(f"""
  %ma{i} = extractelement <8 x i64> %lacc, i64 {2 * i}
  %mb{i} = extractelement <8 x i64> %lacc, i64 {2 * i + 1}
  %xa{i} = xor i64 %ma{i}, {_i64(_MERGE[2 * i])}
  %xb{i} = xor i64 %mb{i}, {_i64(_MERGE[2 * i + 1])}
  %wa{i} = zext i64 %xa{i} to i128
  %wb{i} = zext i64 %xb{i} to i128
  %pw{i} = mul i128 %wa{i}, %wb{i}
  %plo{i} = trunc i128 %pw{i} to i64
  %phs{i} = lshr i128 %pw{i}, 64
  %phi{i} = trunc i128 %phs{i} to i64
  %f{i} = xor i64 %plo{i}, %phi{i}
  %h{i + 1} = add i64 {h}, %f{i}""")
        h = f"%h{i + 1}"
    return f"""
define i64 @{name}(ptr noalias readonly %src, ptr noalias %dst, i64 %len) nounwind {{
entry:{entry}
  %lm1 = sub i64 %len, 1
  %blocks = udiv i64 %lm1, 1024
  %full = mul i64 %blocks, 1024
  %rem = sub i64 %lm1, %full
  %tail = udiv i64 %rem, 64
  br label %block_head
block_head:
  %blk = phi i64 [0, %start], [%blk1, %scramble]
  %acc0 = phi <8 x i64> [{_vector(_INIT_ACC)}, %start], [%sacc, %scramble]
  %isfull = icmp ult i64 %blk, %blocks
  %stripes = select i1 %isfull, i64 16, i64 %tail
  %base = shl i64 %blk, 10
  br label %stripe_head
stripe_head:
  %s = phi i64 [0, %block_head], [%s1, %stripe_body]
  %acc = phi <8 x i64> [%acc0, %block_head], [%aacc, %stripe_body]
  %more = icmp ult i64 %s, %stripes
  br i1 %more, label %stripe_body, label %block_end
stripe_body:
  %s64 = shl i64 %s, 6
  %off = add i64 %base, %s64
  %p = getelementptr inbounds i8, ptr %src, i64 %off
  %d = load <8 x i64>, ptr %p, align 1{store}
  %kp = getelementptr inbounds i64, ptr @keys, i64 %s
  %k = load <8 x i64>, ptr %kp, align 8{_accumulate("a", "%d", "%k", "%acc")}
  %s1 = add i64 %s, 1
  br label %stripe_head
block_end:
  br i1 %isfull, label %scramble, label %finish
scramble:
  %ks = load <8 x i64>, ptr getelementptr inbounds ([24 x i64], ptr @keys, i64 0, i64 16), align 8
  %sh = lshr <8 x i64> %acc, {_vector([47] * 8)}
  %x1 = xor <8 x i64> %acc, %sh
  %x2 = xor <8 x i64> %x1, %ks
  %sacc = mul <8 x i64> %x2, {_vector([_P32_1] * 8)}
  %blk1 = add i64 %blk, 1
  br label %block_head
finish:
  %ft = shl i64 %tail, 6
  %done = add i64 %full, %ft{rest}
  %lo = sub i64 %len, 64
  %lp = getelementptr inbounds i8, ptr %src, i64 %lo
  %ld = load <8 x i64>, ptr %lp, align 1{_accumulate("l", "%ld", _vector(_LAST), "%acc")}
  %h0 = mul i64 %len, {_i64(_P64_1)}{"".join(merge)}
  %v1 = lshr i64 {h}, 37
  %v2 = xor i64 {h}, %v1
  %v3 = mul i64 %v2, {_i64(_AVALANCHE)}
  %v4 = lshr i64 %v3, 32
  %v5 = xor i64 %v3, %v4{fence}
  ret i64 %v5
}}
"""


def _object_ir(name: str, offset: int) -> str:
    """``i64 name(PyObject* src, PyObject* dst, i64 len)``: `name`_raw on the
    data pointers of two numpy arrays, read from the array objects at
    `offset` (``PyArrayObject.data``: ctypes then passes the objects as
    they are, which costs less than asking numpy for their addresses)."""
    return f"""
define i64 @{name}(ptr %so, ptr %do, i64 %len) nounwind {{
  %sp = getelementptr inbounds i8, ptr %so, i64 {offset}
  %s = load ptr, ptr %sp, align 8
  %dp = getelementptr inbounds i8, ptr %do, i64 {offset}
  %d = load ptr, ptr %dp, align 8
  %r = call i64 @{name}_raw(ptr %s, ptr %d, i64 %len)
  ret i64 %r
}}
"""


_KEYS = _secret_words(0, 24)  # stripe keys (words 0..23); scramble keys (16..23)
_LAST = _secret_words(121, 8)  # 192 - 64 - XXH_SECRET_LASTACC_START (7)
_MERGE = _secret_words(11, 8)  # XXH_SECRET_MERGEACCS_START


def _data_offset() -> int | None:
    """Where numpy keeps an array's data pointer in the array object
    (``PyArrayObject.data``, right after the object header), checked on a
    few arrays; ``None`` if it is not where expected."""
    probes = [np.zeros(3), np.arange(10.0)[3:], np.zeros((4, 5), np.float32)]
    for offset in (16,):
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data
               for a in probes):
            return offset
    return None


def _build():
    """Compile the kernels (once per process); ``()`` if that fails."""
    global _KERNELS, _ENGINE
    with _BUILD_LOCK:
        if _KERNELS is not None:
            return _KERNELS
        try:
            import llvmlite.binding as llvm

            offset = _data_offset()
            keys = ", ".join(f"i64 {_i64(k)}" for k in _KEYS)
            # Streaming stores (and their sfence) on x86; elsewhere the
            # "stream" kernel is the plain one.
            x86 = llvm.get_default_triple().split("-")[0] in ("x86_64", "i686", "i386")
            kernels = ("xxh3_copy", "xxh3_hash", "xxh3_stream")
            ir = (f"@keys = private unnamed_addr constant [24 x i64] [{keys}], align 8\n"
                  "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)\n"
                  + ("declare void @llvm.x86.sse.sfence()\n!0 = !{i32 1}\n" if x86 else "")
                  + _kernel_ir("xxh3_copy_raw", True) + _kernel_ir("xxh3_hash_raw", False)
                  + _kernel_ir("xxh3_stream_raw", True, stream=x86)
                  + "".join(_object_ir(k, offset) for k in kernels if offset is not None))
            target = llvm.Target.from_default_triple()
            machine = target.create_target_machine(
                cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                opt=3)
            module = llvm.parse_assembly(ir)
            module.verify()
            builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
            builder.getModulePassManager().run(module, builder)
            engine = llvm.create_mcjit_compiler(module, machine)
            engine.finalize_object()
            # CFUNCTYPE: the GIL is released during the call.
            raw = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int64)
            obj = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.py_object, ctypes.py_object,
                                   ctypes.c_int64)
            if offset is not None:
                built = tuple(obj(engine.get_function_address(k)) for k in kernels)
            else:
                built = tuple(_by_address(raw(engine.get_function_address(k + "_raw")))
                              for k in kernels)
            # Refuse a miscompiled kernel: it must agree with xxhash, on
            # aligned and unaligned data and lengths.
            rng = np.random.default_rng(0)
            raw_bytes = rng.integers(0, 256, 5000, dtype=np.uint8)
            for start, n in ((0, 4096), (1, 4099), (8, 1000), (3, 241)):
                probe = raw_bytes[start:start + n]
                want = xxhash.xxh3_64_intdigest(probe)
                if built[1](probe, probe, n) != want:
                    raise RuntimeError("the xxh3 kernel disagrees with xxhash")
                for k in (built[0], built[2]):
                    copied = np.zeros(n + 1, np.uint8)[1:] if start else np.zeros(n, np.uint8)
                    if k(probe, copied, n) != want or not np.array_equal(copied, probe):
                        raise RuntimeError("the xxh3 copy kernel disagrees with xxhash")
            _ENGINE = engine
        except Exception:  # no usable LLVM here: np.copyto + xxhash do the work
            built = ()
        _KERNELS = built
        return built


def _by_address(fn):
    """A kernel taking data pointers, called with arrays."""
    return lambda src, dst, n: fn(src.ctypes.data, dst.ctypes.data, n)


# -- helpers shared by the tier implementations ----------------------------------

def step_of(spec) -> int | None:
    """The checkpointed step a spec carries (``spec["step"]``), if any."""
    step = spec.get("step") if isinstance(spec, dict) else None
    return step if type(step) is int else None


def where(key: str, tier: str, step: int | None) -> str:
    """``"record 'k' (step 7) in tier 'memory'"``, for messages."""
    at = f" (step {step})" if step is not None else ""
    return f"record {key!r}{at} in tier {tier!r}"


def corrupt(message: str, key: str, tier: str, step: int | None) -> CorruptCheckpointError:
    """A :class:`CorruptCheckpointError` whose message names the record and says what to do."""
    return CorruptCheckpointError(
        f"{where(key, tier, step)} is corrupt: {message}. The stored data was damaged or "
        "modified after it was saved; delete the record and recompute the state from an "
        "earlier checkpoint",
        key=key, tier=tier, step=step,
    )


def check_record(key: str, record: Record) -> None:
    """Validate what a tier is asked to store (cheap: no hashing)."""
    check_key(key)
    if not isinstance(record, Record):
        raise TypeError(f"tiers store Record objects, got {type(record).__name__}; build one "
                        "with vlcc_adjoint.storage.make_record(spec, leaves)")
    if len(record.checksums) != len(record.leaves):
        raise ValueError(f"record {key!r} has {len(record.leaves)} leaves but "
                         f"{len(record.checksums)} checksums; build it with make_record")
    for i, checksum in enumerate(record.checksums):
        if not (type(checksum) is str and _HEX16.fullmatch(checksum)):
            raise ValueError(f"checksum {i} of record {key!r} is {checksum!r}, not 16 hex digits "
                             "(xxh3-64); build the record with make_record")
    for i, leaf in enumerate(record.leaves):
        if type(leaf) is not np.ndarray or not leaf.flags.c_contiguous or leaf.dtype.hasobject:
            raise TypeError(f"leaf {i} of record {key!r} must be a C-contiguous numpy array of a "
                            "non-object dtype; build the record with make_record")


def encode_spec(key: str, spec) -> str:
    """``spec`` as strict JSON text (no NaN/Infinity), or a ``ValueError`` naming the key."""
    try:
        return _ENCODER.encode(spec)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the spec of record {key!r} is not pure JSON ({err}); specs hold only dicts, lists, "
            "strings, finite numbers, bools and None (vlcc_adjoint.state.flatten makes such specs)"
        ) from None


def verify_leaves(leaves, checksums, key: str, tier: str, step: int | None) -> None:
    """Recompute every leaf's checksum; :class:`CorruptCheckpointError` on a mismatch."""
    for i, (leaf, want) in enumerate(zip(leaves, checksums)):
        got = leaf_checksum(leaf)
        if got != want:
            raise corrupt(f"leaf {i} ({leaf.dtype.str}{list(leaf.shape)}) has checksum {got}, "
                          f"the record says {want}", key, tier, step)


def check_capacity(capacity_bytes) -> int | None:
    """``capacity_bytes`` validated: ``None`` (unbounded) or an int >= 0."""
    if capacity_bytes is None:
        return None
    if isinstance(capacity_bytes, (bool, float)) or not isinstance(capacity_bytes, (int, np.integer)) \
            or capacity_bytes < 0:
        raise ValueError(f"capacity_bytes must be None (unbounded) or an int >= 0, got {capacity_bytes!r}")
    return int(capacity_bytes)


def full(key: str, tier: str, need: int, used: int, capacity: int) -> TierFullError:
    """A :class:`TierFullError` with the numbers and the remedy."""
    return TierFullError(
        f"record {key!r} needs {need} bytes but tier {tier!r} has {capacity - used} of "
        f"{capacity} free; delete records first (the engine evicts), or give the tier a larger "
        "capacity_bytes"
    )

