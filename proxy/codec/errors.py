"""The codec's exceptions."""

from __future__ import annotations

__all__ = ["CodecError", "MalformedAnswer", "Undecodable"]


#   CodecError
#    ├── Undecodable      valid answer we do not model (native histograms): pass it through
#    └── MalformedAnswer  not a successful Prometheus query answer, or not JSON at all
class CodecError(Exception):
    pass


class Undecodable(CodecError):
    pass


class MalformedAnswer(CodecError):
    pass

