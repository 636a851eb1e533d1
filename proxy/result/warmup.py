"""`python -m proxy.result.warmup`, kept for the Makefile and the Dockerfile: the cross-store
kernels' warmup lives in proxy/engine/warmup.py (`python -m proxy.engine.warmup`)."""

from __future__ import annotations

from proxy.engine.warmup import warm_up

__all__ = ["warm_up"]

if __name__ == "__main__":
    print(f"promaccel cross-store kernels compiled in {warm_up():.1f}s")
