"""gradcomp._core: the compiled module, in the instruction-set variant this CPU runs best.

The wheel holds one build of python/src/gradcomp_core.cpp per variant (python/CMakeLists.txt):
``_core_generic`` (the platform's baseline: SSE2 on x86-64) and, on x86-64, ``_core_x86_64_v3``
(AVX2, FMA, F16C) and ``_core_x86_64_v4`` (AVX-512). This module imports one of them and
re-exports its names, so ``gradcomp._core.Plan`` and friends are the same whichever runs.

``GRADCOMP_ISA`` chooses: ``auto`` (the default: the preferred variant the CPU supports),
``generic``, ``x86-64-v3`` or ``x86-64-v4``. A forced variant that was not built, or that this
CPU lacks instructions for, raises ImportError naming what is missing (never SIGILL).

The variants compute the same sums, but not always the same bits: the compiler may contract
a * b + c into one FMA where the ISA has it, and Eigen's products vectorise differently. Ranks of
one job should therefore run the same variant: on one kind of machine they do; on a mixed
cluster set ``GRADCOMP_ISA`` alike on every rank. A GradiVeQ basis that differs between ranks is
caught by the exchange's per-step state digest (``ExchangeFailure``, state disagreement), not
summed silently (docs/python.md, "Instruction sets").
"""

import importlib
import importlib.util
import os

#: Variants in the order ``auto`` prefers them (first supported and built wins).
PREFERENCE = ("x86-64-v4", "x86-64-v3", "generic")

#: The /proc/cpuinfo flags each x86-64 variant needs (the psABI's micro-architecture levels, each
#: level's on top of the one below; the kernel lists a flag only when the OS also saves its registers).
_V2 = ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
REQUIRED_FLAGS = {"generic": (), "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}


def _module_name(variant: str) -> str:
    return "_core_" + variant.replace("-", "_")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo"):
    """The CPU's feature flags as the kernel reports them, or None where /proc/cpuinfo is absent."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return frozenset()


def built_variants():
    """The variants this installation holds, in PREFERENCE order."""
    return tuple(v for v in PREFERENCE if importlib.util.find_spec(f"{__package__}.{_module_name(v)}") is not None)


def missing_flags(variant: str, flags) -> tuple:
    """The flags `variant` needs that `flags` lacks (all of them when flags is None: unknown CPU)."""
    need = REQUIRED_FLAGS[variant]
    if flags is None:
        return need
    return tuple(f for f in need if f not in flags)


def select(requested: str = "auto", flags=None, built=None) -> str:
    """The variant to import for GRADCOMP_ISA=`requested` on a CPU with `flags`."""
    built = built_variants() if built is None else built
    requested = requested.strip().lower() or "auto"
    if requested == "auto":
        for v in PREFERENCE:
            if v in built and not missing_flags(v, flags):
                return v
        raise ImportError(f"gradcomp: no usable build of gradcomp._core in this installation (built: {list(built)})")
    if requested not in REQUIRED_FLAGS:
        raise ImportError(f"gradcomp: GRADCOMP_ISA={requested!r} is not one of auto, {', '.join(REQUIRED_FLAGS)}")
    if requested not in built:
        raise ImportError(f"gradcomp: GRADCOMP_ISA={requested!r} was not built into this installation "
                          f"(built: {', '.join(built) or 'none'}; python/CMakeLists.txt, GRADCOMP_PYTHON_ISA_VARIANTS)")
    lack = missing_flags(requested, flags)
    if lack:
        raise ImportError(f"gradcomp: GRADCOMP_ISA={requested!r} needs CPU features this machine lacks "
                          f"({' '.join(lack)})")
    return requested


#: The variants installed, and the one imported in this process.
isa_variants = built_variants()
isa = select(os.environ.get("GRADCOMP_ISA", "auto"), cpu_flags(), isa_variants)

_impl = importlib.import_module(f"{__package__}.{_module_name(isa)}")
globals().update({k: v for k, v in vars(_impl).items() if not k.startswith("__")})
del _impl
