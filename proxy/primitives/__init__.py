"""Small mechanisms with no knowledge of any layer, so that every layer may use them.

    clock.py    the wall clock in integer milliseconds (`wall_ms`): the one clock of cache
                entries, invalidation markers, freshness and routing windows
    breaker.py  the circuit breaker state machine (closed -> open -> half-open probe) that
                the Redis store (`cache/breaker.py`) and each backend (`backends/circuit.py`)
                wrap with their own metrics and errors

Why a package of its own: `cache/` and `backends/` are sibling layers (neither may import
the other), and both need the breaker and the clock; putting them below both keeps one
implementation without an import across siblings. Nothing here imports another proxy module
(checked by `tests/primitives/test_layering.py`).
"""
