"""Interned collective signatures: one per (call site, arguments, tensor metadata), built the first time
the hot path meets that key and looked up by it afterwards."""

from __future__ import annotations

from ..fingerprint import CollectiveSignature
from . import intercept

MAX_SIGNATURES = 4096  # distinct (call site, arguments, tensor metadata) kept encoded


def roles(spec: intercept.OpSpec, args: tuple, kwargs: dict) -> tuple[str, ...]:
    """Per compared tensor of a call, in the order `CallRecorder.before` records their shapes, whether the
    call reads it ("in"), fills it ("out") or both (""). Only for a signature not seen before."""
    found: list[str] = []
    for index, name, compared in spec.tensors:
        value = args[index] if index < len(args) else kwargs.get(name)
        if value is None or not compared:
            continue
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            for tensor in item if isinstance(item, (list, tuple)) else (item,):
                if getattr(tensor, "device", None) is not None:
                    found.append(intercept.role_of(spec.name, name))
    return tuple(found)


class Signatures(dict[tuple, CollectiveSignature]):
    """Key -> CollectiveSignature. The hot path reads it with the dict's own `get`."""

    def intern(self, key: tuple, spec: intercept.OpSpec, args: tuple, kwargs: dict) -> CollectiveSignature:
        """Build and keep the signature for a key not seen before (a new call site or new shapes)."""
        op, group, reduce_op, root, site, library, metas = key
        compare_shapes = spec.compare_shapes
        shapes: list = []
        dtypes: list = []
        devices: list = []
        for meta in metas:
            device = meta
            if meta.__class__ is tuple:
                shape, dtype, device = meta
                if compare_shapes:
                    shapes.append(list(shape))
                dtypes.append(str(dtype).replace("torch.", ""))
            devices.append(str(device) if device.index is not None else device.type)
        found = roles(spec, args, kwargs) if shapes else ()
        signature = CollectiveSignature(group, op, reduce_op, root, shapes, dtypes, devices, site, library,
                                        found if len(found) == len(shapes) and any(found) else ())
        if len(self) >= MAX_SIGNATURES:
            self.clear()  # shapes that change every step (variable-length batches)
        self[key] = signature
        return signature
