"""The attention backends as one table, name -> Backend; availability, `auto` and the dispatch read only it.

Each backend ranks itself per device type, so auto on CUDA tries flash_attn, torch_varlen, flex,
bucketed, sdpa; on CPU bucketed, flex, sdpa (there flex's fused forward loses to bucketed and has
no backward in torch 2.13); on any other device bucketed, sdpa. Adding a backend is its function
(q, k, v, cu_seqlens, max_seqlen, causal, window, scale -> out, as in sdpa.py) and one line in
BACKENDS. A backend whose function also takes `key_windows` (a role policy, sdpa.py) says so with
roles=True; auto then picks among those only when a policy is given (CUDA: flex; CPU: bucketed).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

from packer.train.attention import flex
from packer.train.attention.bucketed import bucketed_sdpa
from packer.train.attention.cuda import flash_attn_varlen, torch_varlen
from packer.train.attention.sdpa import sdpa_per_document

HALF = (torch.float16, torch.bfloat16)


def _always(*_) -> bool:
    return True


@functools.lru_cache(maxsize=None)
def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _has(name: str) -> Callable[[], bool]:
    return functools.partial(_has_module, name)


@dataclass(frozen=True)
class Backend:
    """One backend: `run(q, k, v, cu_seqlens, max_seqlen, causal, window, scale) -> out` and where it fits.

    `devices` maps a device type ("cuda", "cpu"; "*" for any) to its rank in auto's order there,
    lower first; a "cuda" entry counts only where torch sees a GPU. `trains(device_type)` says
    whether its backward runs there; `dtypes` None means any; `available()` is checked once it
    is asked for (cached probes: no import, no kernel launch); `roles`: `run` takes key_windows
    (a role policy: packer.masks.RolePolicy).
    """

    run: Callable
    devices: dict[str, int]
    note: str
    trains: Callable[[str], bool] = _always
    dtypes: tuple[torch.dtype, ...] | None = None
    available: Callable[[], bool] = _always
    roles: bool = False


BACKENDS: dict[str, Backend] = {
    "flash_attn": Backend(flash_attn_varlen, {"cuda": 0}, "fp16/bf16 only", dtypes=HALF, available=_has("flash_attn")),
    "torch_varlen": Backend(torch_varlen, {"cuda": 1}, "fp16/bf16 only", dtypes=HALF,
                            available=_has("torch.nn.attention.varlen")),
    "flex": Backend(flex.flex_varlen, {"cuda": 2, "cpu": 4}, f"compiled when T >= {flex.FLEX_COMPILE_MIN_TOKENS}",
                    trains=flex.trains, available=_has("torch.nn.attention.flex_attention"), roles=True),
    "bucketed": Backend(bucketed_sdpa, {"*": 3}, "exact; one batched SDPA per length group", roles=True),
    "sdpa": Backend(sdpa_per_document, {"*": 5}, "exact reference; one SDPA per document", roles=True),
}


def _rank(backend: Backend, device_type: str) -> int | None:
    if device_type in backend.devices and (device_type != "cuda" or torch.cuda.is_available()):
        return backend.devices[device_type]
    return backend.devices.get("*")


def backend_names(device_type: str) -> list[str]:
    """Names of the backends that run on this device type, in auto's order (fastest first)."""
    ranked = []
    for name, backend in BACKENDS.items():
        rank = _rank(backend, device_type)
        if rank is not None and backend.available():
            ranked.append((rank, name))
    return [name for _, name in sorted(ranked, key=lambda r: r[0])]  # stable: ties keep table order


def available_backends(device="cpu") -> dict[str, dict]:
    """Backends that run on `device`, fastest first, each {"forward": bool, "backward": bool,
    "roles": bool (runs a role policy), "note": str}.

    `backend="auto"` takes the first that fits the dtype and, when gradients are needed, can train.
    """
    kind = torch.device(device).type
    out = {}
    for name in backend_names(kind):
        backend = BACKENDS[name]
        trains = backend.trains(kind)
        note = backend.note + ("" if trains else f"; torch {torch.__version__} has no {name} backward on {kind}")
        out[name] = {"forward": True, "backward": trains, "roles": backend.roles, "note": note}
    return out


def pick_backend(device, dtype: torch.dtype, requires_grad: bool, roles: bool = False) -> str:
    """The backend `auto` resolves to for these inputs (`roles`: with a role policy)."""
    kind = torch.device(device).type
    for name in backend_names(kind):
        backend = BACKENDS[name]
        if (backend.dtypes is not None and dtype not in backend.dtypes) or (roles and not backend.roles):
            continue
        if not requires_grad or backend.trains(kind):
            return name
    return "sdpa"
