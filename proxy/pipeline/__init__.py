"""The query path as a pipeline of small stages (the list, in order: `path.py`)."""

from .service import QueryService
from .values import Answer

__all__ = ["Answer", "QueryService"]
