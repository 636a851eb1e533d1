import os

__version__ = "0.1.0"

# Arrow (the cache's payloads) allocates with malloc, not its bundled mimalloc
# (proxy/runtime/memory.py says why). Arrow reads this once, when first asked for its pool, so it is
# set before anything of promaccel imports pyarrow; a value the user set wins.
ARROW_POOL_CHOSEN = "ARROW_DEFAULT_MEMORY_POOL" in os.environ
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
