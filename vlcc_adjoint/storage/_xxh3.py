"""XXH3-64 of long inputs as an LLVM IR kernel: hash, copy-and-hash, and
copy-and-hash with streaming stores, in one pass over the input.

The function is Y. Collet's XXH3-64 (``XXH3_hashLong_64b_default`` of
``xxhash.h`` v0.8: default secret, seed 0) for inputs of more than 240
bytes, bit for bit: the stored format (16 hexadecimal digits) is the one
the ``xxhash`` package computes, and ``tests/storage/test_checksum.py`` compares
the two for every length class and alignment.

The algorithm.  The input is read in 64-byte *stripes*, one ``<8 x i64>``
vector each; stripe ``s`` of a 1024-byte *block* is mixed into eight
64-bit lanes with the secret words ``s .. s+7``::

    k = d ^ secret[s:s+8];   acc += swap_pairs(d) + lo32(k) * hi32(k)

(``lo32 * hi32`` of 64-bit lanes is one ``vpmuludq``; ``swap_pairs`` swaps
lanes ``2i`` and ``2i+1``).  After each full block the lanes are scrambled
with secret words 16..23 (``acc = (acc ^ acc >> 47 ^ key) * PRIME32_1``);
the last, partial block stops one stripe short, and the input's final 64
bytes are mixed in again with the secret at byte 121; the lanes are folded
pairwise with 128-bit products against the secret at byte 11 and the sum is
avalanched (``h ^= h >> 37; h *= 0x165667919E3779F9; h ^= h >> 32``).

Why LLVM IR and not a numba loop.  The lanes must live in one vector
register per stripe.  A numba (or plain LLVM loop-vectorised) version of
the same loop keeps eight scalar lanes, or vectorises *across* stripes and
then spends its time transposing them, and runs at a third of the speed of
a copy; written with explicit ``<8 x i64>`` vectors the hash rides on the
copy's memory traffic, so the store's capture and restore each cost one
pass over the data instead of two (``benchmarks/bench_store_calls.py``
measures the paths against ``np.copyto``; results in
``benchmarks/results/``).  The copy's plain stores are ``volatile`` so that
LLVM keeps them in the loop instead of splitting them back out into a
``memcpy`` call per block.  The *stream* variant writes the destination
with non-temporal stores (x86; elsewhere it is the plain copy): a
checkpoint is not read again soon, so writing it neither reads the
destination's old contents first nor evicts the caller's working set.

Calling convention.  llvmlite (numba's LLVM binding) compiles the module
once per process; each kernel is ``u64 f(u64 src_address, u64 dst_address,
i64 nbytes)``, called through ctypes, which releases the GIL for the call
(a worker thread hashing does not stop the caller).  The arrays' data
pointers come from numba's array model (a small cached function), not
from numpy's ``arr.ctypes``, whose construction costs more than a kernel
call on a small leaf.

Reference: Y. Collet, "xxHash: extremely fast non-cryptographic hash
algorithm", XXH3 (2019-2021), https://github.com/Cyan4973/xxHash
(``xxhash.h``: ``XXH3_accumulate_512``, ``XXH3_scrambleAcc``,
``XXH3_mergeAccs``, ``XXH3_avalanche``; ``doc/xxhash_spec.md``).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import xxhash

from ..errors import VlccRuntimeError

__all__ = ["build"]

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
    store = (
        """
  %q = getelementptr inbounds i8, ptr %dst, i64 %off
  store volatile <8 x i64> %d, ptr %q, align 1"""
        if copy
        else ""
    )
    if stream:  # four 16-byte streaming stores (64-byte ones need 64-byte alignment)
        store = """
  %q = getelementptr inbounds i8, ptr %dst, i64 %off""" + "".join(
            f"""
  %d{j} = shufflevector <8 x i64> %d, <8 x i64> poison, <2 x i32> <i32 {2 * j}, i32 {2 * j + 1}>
  %q{j} = getelementptr inbounds i8, ptr %q, i64 {16 * j}
  store <2 x i64> %d{j}, ptr %q{j}, align 16, !nontemporal !0"""
            for j in range(4)
        )
    # A streaming copy needs a 16-byte-aligned destination: else the plain one.
    entry = (
        f"""
  %dint = ptrtoint ptr %dst to i64
  %dmis = and i64 %dint, 15
  %daligned = icmp eq i64 %dmis, 0
  br i1 %daligned, label %start, label %plain
plain:
  %pr = tail call i64 @{name.replace("_stream", "_copy")}(ptr %src, ptr %dst, i64 %len)
  ret i64 %pr
start:"""
        if stream
        else """
  br label %start
start:"""
    )
    # Streaming stores are weakly ordered: fence them before anyone may look.
    fence = (
        """
  call void @llvm.x86.sse.sfence()"""
        if stream
        else ""
    )
    # The bytes after the last whole stripe of the last block (its final
    # stripe is hashed below, from the end of the input).
    rest = (
        """
  %rp = getelementptr inbounds i8, ptr %src, i64 %done
  %rq = getelementptr inbounds i8, ptr %dst, i64 %done
  %rlen = sub i64 %len, %done
  call void @llvm.memcpy.p0.p0.i64(ptr %rq, ptr %rp, i64 %rlen, i1 false)"""
        if copy
        else ""
    )
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


_KEYS = _secret_words(0, 24)  # stripe keys (words 0..23); scramble keys (16..23)
_LAST = _secret_words(121, 8)  # 192 - 64 - XXH_SECRET_LASTACC_START (7)
_MERGE = _secret_words(11, 8)  # XXH_SECRET_MERGEACCS_START


def _entry_ir(name: str) -> str:
    """``i64 name(i64 src, i64 dst, i64 len)``: `name`_raw on two addresses
    (integers: what a caller holding arrays can pass without ctypes objects)."""
    return f"""
define i64 @{name}(i64 %s, i64 %d, i64 %len) nounwind {{
  %sp = inttoptr i64 %s to ptr
  %dp = inttoptr i64 %d to ptr
  %r = call i64 @{name}_raw(ptr %sp, ptr %dp, i64 %len)
  ret i64 %r
}}
"""


_NAMES = ("xxh3_copy", "xxh3_hash", "xxh3_stream")


def _compile():
    """The LLVM module compiled for this host: ``(engine, {name: address})``."""
    import llvmlite.binding as llvm

    keys = ", ".join(f"i64 {_i64(k)}" for k in _KEYS)
    # Streaming stores (and their sfence) on x86; elsewhere the "stream"
    # kernel is the plain one.
    x86 = llvm.get_default_triple().split("-")[0] in ("x86_64", "i686", "i386")
    ir = (
        f"@keys = private unnamed_addr constant [24 x i64] [{keys}], align 8\n"
        "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)\n"
        + ("declare void @llvm.x86.sse.sfence()\n!0 = !{i32 1}\n" if x86 else "")
        + _kernel_ir("xxh3_copy_raw", True)
        + _kernel_ir("xxh3_hash_raw", False)
        + _kernel_ir("xxh3_stream_raw", True, stream=x86)
        + "".join(_entry_ir(name) for name in _NAMES)
    )
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    module = llvm.parse_assembly(ir)
    module.verify()
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
    builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return engine, {name: engine.get_function_address(name) for name in _NAMES}


@functools.cache
def _pointers():
    """``data_pointers(src, dst) -> (int, int)``: the arrays' data addresses,
    read by numba from its array model (compiled once per array type and
    cached on disk; asking numpy for ``arr.ctypes.data`` costs more than a
    kernel call on a 128 KiB leaf)."""
    import numba

    @numba.njit(nogil=True, cache=True)
    def data_pointers(src, dst):
        return src.ctypes.data, dst.ctypes.data

    return data_pointers


def _array_kernel(address: int):
    """``f(src, dst, nbytes)`` on C-contiguous arrays: the kernel at
    `address`, called through ctypes (which releases the GIL for the call)
    with the arrays' data pointers."""
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64)(
        address
    )
    data_pointers = _pointers()

    def kernel(src, dst, nbytes):
        s, d = data_pointers(src, dst)
        return fn(s, d, nbytes)

    return kernel


def build():
    """Compile the kernels: ``(engine, (copy, hash, stream))``.

    Each kernel is ``f(src, dst, nbytes) -> int``, the xxh3-64 of the
    `nbytes` (more than 240) bytes of the C-contiguous array `src`; ``copy``
    and ``stream`` also copy them into `dst` (``hash`` ignores it).  The
    engine owns the machine code: keep it as long as the kernels.  Raises
    ``RuntimeError`` if a kernel disagrees with ``xxhash`` on a self-test
    (aligned and unaligned data, partial blocks and stripes): a miscompiled
    kernel is never used.
    """
    engine, addresses = _compile()
    built = tuple(_array_kernel(addresses[name]) for name in _NAMES)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 5000, dtype=np.uint8)
    for start, n in ((0, 4096), (1, 4099), (8, 1000), (3, 241)):
        probe = raw[start : start + n]
        want = xxhash.xxh3_64_intdigest(probe)
        if built[1](probe, probe, n) != want:
            raise VlccRuntimeError(
                f"the compiled xxh3 kernel disagrees with xxhash on {n} bytes; "
                "report this with your CPU model and llvmlite version"
            )
        for k in (built[0], built[2]):
            copied = np.zeros(n + 1, np.uint8)[1:] if start else np.zeros(n, np.uint8)
            if k(probe, copied, n) != want or not np.array_equal(copied, probe):
                raise VlccRuntimeError(
                    f"the compiled xxh3 copy kernel disagrees with xxhash on {n} "
                    "bytes; report this with your CPU model and llvmlite version"
                )
    return engine, built
