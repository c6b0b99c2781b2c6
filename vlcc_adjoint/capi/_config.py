"""The ``config_json`` of ``vlcc_run_open``: a schedule and a store, as JSON.

The keys are the Python constructors' arguments, so the JSON reads like
the Python it stands for::

    {"schedule": {"kind": "revolve", "steps": 1000, "snapshots": 10}}

is ``Revolve(steps=1000, snapshots=10)`` with one memory level, and ::

    {"schedule": {"kind": "multistage", "steps": 1000,
                  "levels": [{"slots": 4},
                             {"slots": 40, "write_cost": 5, "read_cost": 5}]},
     "store": {"tiers": [{"kind": "memory"},
                         {"kind": "zarr", "path": "ckpt.zarr", "mode": "w"}]}}

is ``Multistage(1000, [Level(4), Level(40, 5, 5)])`` over a
``TieredStore([MemoryTier(), ZarrTier("ckpt.zarr", mode="w")], plan=...)``.

``schedule``
    ``kind``: ``"revolve"`` (:class:`~vlcc_adjoint.schedules.Revolve`:
    ``steps``, ``snapshots``), ``"multistage"``
    (:class:`~vlcc_adjoint.schedules.Multistage`: ``steps``, ``levels``,
    ``forward_cost``, ``adjoint_cost``; a level is ``{"slots", "write_cost",
    "read_cost"}`` or ``[slots, write_cost, read_cost]``), ``"storeall"``
    (``steps``, ``level``), ``"periodic"`` (``steps``, ``every``, ``level``,
    ``buffer_level``), ``"online"`` (``steps``, ``snapshots``: the number
    of steps must be known, a C time loop has no stop criterion here).

``store`` (optional)
    ``tiers``: one per level of the schedule, fastest first; each
    ``{"kind": "memory", "capacity_bytes"}``, ``{"kind": "compressed",
    "codec", "capacity_bytes"}`` (``codec`` as a codec's ``config()``
    writes it, e.g. ``{"name": "vlcc_lossless", "configuration": {"clevel":
    5}}``) or ``{"kind": "zarr", "path", "capacity_bytes", "mode",
    "durable"}``.  Default: one unbounded memory tier per level.  The other
    keys are :class:`~vlcc_adjoint.storage.TieredStore`'s (``prefetch_bytes``,
    ``staging_bytes``, ``workers``, ``policy``, ``dedup``, ``lookahead``,
    ``pool_bytes``, ``threadsafe``), and ``reserve``: capture buffers for
    that many states allocated and touched when the run starts
    (:meth:`~vlcc_adjoint.storage.TieredStore.reserve`), so that the first
    saves do not pay the page faults.  A store of memory tiers only is
    single-threaded (``threadsafe=False``: the run calls it from one thread
    at a time), any other keeps background threads for its slower levels.

Unknown keys are errors (a misspelt key would otherwise be ignored).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import VlccValueError
from ..schedules import Level, Multistage, Online, Periodic, Revolve, Schedule, StoreAll
from ..storage import CompressedMemoryTier, MemoryTier, Tier, TieredStore, ZarrTier
from ..storage.codecs import codec_from_config

__all__ = ["RunConfig", "parse_config"]

#: The schedule kinds of ``config_json``, and their constructors.
SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "revolve": Revolve,
    "multistage": Multistage,
    "storeall": StoreAll,
    "periodic": Periodic,
    "online": Online,
}

#: The keys of each tier kind (beside ``kind``).
TIER_KEYS = {
    "memory": ("capacity_bytes",),
    "compressed": ("codec", "capacity_bytes"),
    "zarr": ("path", "capacity_bytes", "mode", "durable"),
}

#: The ``TieredStore`` arguments ``store`` may set.
STORE_KEYS = (
    "prefetch_bytes",
    "staging_bytes",
    "workers",
    "policy",
    "dedup",
    "lookahead",
    "pool_bytes",
    "threadsafe",
)


class RunConfig:
    """A parsed ``config_json``.

    **Attributes:**

    - `schedule`: the :class:`~vlcc_adjoint.schedules.Schedule`.
    - `tiers`: the tier descriptions (``{"kind", ...}``), one per level,
      or ``None`` for the default.
    - `store`: the ``TieredStore`` keyword arguments given.
    - `reserve`: states' worth of capture buffers to allocate at the start.
    """

    def __init__(
        self,
        schedule: Schedule,
        tiers: list[dict[str, Any]] | None,
        store: dict[str, Any],
        reserve: int,
    ) -> None:
        self.schedule = schedule
        self.tiers = tiers
        self.store = store
        self.reserve = reserve

    def make_store(self, levels: int, plan: Any) -> TieredStore:
        """The store of the run: the tiers described (one per level of the
        schedule), following `plan` (the schedule's ``io_plan``)."""
        specs = self.tiers if self.tiers is not None else [{"kind": "memory"}] * levels
        if len(specs) < levels:
            raise VlccValueError(
                f"the schedule uses {levels} storage levels and store.tiers describes "
                f"{len(specs)}; describe one tier per level, fastest first"
            )
        tiers: list[Tier] = []
        try:
            for spec in specs:
                tiers.append(_make_tier(spec))
            options = dict(self.store)
            if "threadsafe" not in options:
                memory_only = all(type(t) is MemoryTier for t in tiers)
                options["threadsafe"] = not memory_only or options.get("workers") not in (None, 0)
            return TieredStore(tiers, plan=plan, **options)
        except BaseException:
            for tier in tiers:
                tier.close()
            raise


def parse_config(text: str) -> RunConfig:
    """Parse a ``config_json`` (module docstring) into a :class:`RunConfig`.

    Raises ``ValueError`` naming what is wrong: malformed JSON, an unknown
    key or kind, arguments a constructor refuses.
    """
    try:
        config = json.loads(text)
    except ValueError as err:
        raise VlccValueError(
            f"config_json is not valid JSON ({err}); write e.g. "
            '{"schedule": {"kind": "revolve", "steps": 1000, "snapshots": 10}}'
        ) from None
    _check_keys(config, "config_json", ("schedule", "store"), required=("schedule",))
    schedule = _make_schedule(config["schedule"])
    store = config.get("store", {})
    _check_keys(store, "config_json's store", ("tiers", "reserve", *STORE_KEYS))
    tiers = store.get("tiers")
    if tiers is not None:
        if not isinstance(tiers, list) or not tiers:
            raise VlccValueError(
                "store.tiers must be a list of tier descriptions, one per level, e.g. "
                '[{"kind": "memory"}, {"kind": "zarr", "path": "ckpt.zarr"}]'
            )
        for k, spec in enumerate(tiers):
            kind = spec.get("kind") if isinstance(spec, dict) else None
            if kind not in TIER_KEYS:
                raise VlccValueError(
                    f"store.tiers[{k}] must be an object with a kind of {sorted(TIER_KEYS)}, "
                    f"got {spec!r}"
                )
            _check_keys(spec, f"store.tiers[{k}]", ("kind", *TIER_KEYS[kind]))
    reserve = store.get("reserve", 0)
    if type(reserve) is not int or reserve < 0:
        raise VlccValueError(f"store.reserve must be an integer >= 0, got {reserve!r}")
    options = {k: v for k, v in store.items() if k in STORE_KEYS}
    return RunConfig(schedule, tiers, options, reserve)


def _check_keys(
    obj: Any, what: str, known: tuple[str, ...], required: tuple[str, ...] = ()
) -> None:
    if not isinstance(obj, dict):
        raise VlccValueError(f"{what} must be a JSON object, got {obj!r:.200}")
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise VlccValueError(f"{what} has unknown keys {unknown}; known keys: {list(known)}")
    absent = [k for k in required if k not in obj]
    if absent:
        raise VlccValueError(f"{what} needs the keys {absent}")


def _make_schedule(spec: Any) -> Schedule:
    """The schedule of ``config_json``'s ``schedule`` object."""
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind not in SCHEDULES:
        raise VlccValueError(
            f"schedule must be an object with a kind of {sorted(SCHEDULES)}, got {spec!r:.200}"
        )
    args = {k: v for k, v in spec.items() if k != "kind"}
    if kind == "multistage" and isinstance(args.get("levels"), list):
        args["levels"] = [_make_level(level, k) for k, level in enumerate(args["levels"])]
    if kind == "online" and args.get("steps") is None:
        raise VlccValueError(
            "an online schedule run through the C interface needs its steps "
            '({"kind": "online", "steps": n, "snapshots": s}): the C time loop has no '
            "stop criterion to pass"
        )
    try:
        schedule = SCHEDULES[kind](**args)
    except TypeError as err:
        raise VlccValueError(
            f"schedule {kind!r} does not take these arguments {sorted(args)}: {err}"
        ) from None
    return schedule


def _make_level(spec: Any, k: int) -> Level:
    try:
        if isinstance(spec, dict):
            return Level(**spec)
        if isinstance(spec, list):
            return Level(*spec)
    except TypeError as err:
        raise VlccValueError(f"schedule.levels[{k}] is not a level: {err}") from None
    raise VlccValueError(
        f"schedule.levels[{k}] must be {{'slots', 'write_cost', 'read_cost'}} or "
        f"[slots, write_cost, read_cost], got {spec!r}"
    )


def _make_tier(spec: dict[str, Any]) -> Tier:
    """The tier of one ``store.tiers`` entry (keys already checked)."""
    args = {k: v for k, v in spec.items() if k != "kind"}
    kind = spec["kind"]
    try:
        if kind == "memory":
            return MemoryTier(**args)
        if kind == "compressed":
            if "codec" in args:
                args["codec"] = codec_from_config(args["codec"])
            return CompressedMemoryTier(**args)
        if "path" not in args:
            raise VlccValueError('a zarr tier needs a path: {"kind": "zarr", "path": "ckpt.zarr"}')
        return ZarrTier(**args)
    except TypeError as err:
        raise VlccValueError(f"the {kind} tier {spec!r} is malformed: {err}") from None
