"""promaccel's PromQL engine: what it evaluates itself above the stores' answers."""
