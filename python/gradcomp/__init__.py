"""gradcomp: gradient compression for data-parallel training (docs/python.md).

The compiled module ``gradcomp._core`` wraps the whole-model exchange's bucket
layer (``include/gradcomp/exchange/bucket_layer.hpp``) on float32 buffers: it
does not link libtorch, so one build serves every torch version. ``gradcomp.torch``
holds the DistributedDataParallel comm hooks (it imports torch when imported).
"""

from ._core import (  # noqa: F401
    BucketLayer,
    Error,
    ExchangeFailure,
    InvalidArgument,
    LayoutError,
    ModelDescription,
    NonFinite,
    OptionMismatch,
    Plan,
    Round,
    SizeMismatch,
    StateError,
    TimeoutError,
    TransportError,
    WireError,
)
from ._core import isa, isa_variants  # noqa: F401  (the instruction-set variant running: docs/python.md)

__version__ = "0.1.0"

#: The codecs a plan can give a layer (exchange::codec_kind).
CODECS = ("dense", "gradiveq", "two_bit", "qsgd", "top_k", "fp16", "bf16", "homomorphic", "powersgd")

__all__ = [
    "BucketLayer", "CODECS", "Error", "ExchangeFailure", "InvalidArgument", "LayoutError", "ModelDescription",
    "NonFinite", "OptionMismatch", "Plan", "Round", "SizeMismatch", "StateError", "TimeoutError", "TransportError",
    "WireError", "isa", "isa_variants",
]
