"""Ask Linux for the AMX tile state in every Python process of a LoRA test server (PYTHONPATH).

vLLM 0.32.0's CPU attention picks its AMX kernel on a CPU with AMX (`cpu_attn.py`,
`torch.cpu._is_amx_tile_supported()`), but nothing asks the kernel for the AMX register state
(arch_prctl ARCH_REQ_XCOMP_PERM), so the first attention call dies with SIGILL unless torch.compile
ran first (Inductor asks). With `--enable-lora` the CPU build runs eager: the server and the offline
engine die on their first request (reproduced on the lab's Sapphire Rapids: "Fatal Python error:
Illegal instruction" in cpu_attention_with_kv_cache, without LoRA too under --enforce-eager). The
GPU image does not run this code. Where AMX is absent the call fails and nothing changes.

Python imports `sitecustomize` at start-up from the path, so the spawned engine-core and worker
processes get it too.
"""

import contextlib
import ctypes
import platform

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

if platform.machine() == "x86_64":
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
