"""Time units and the fixed "now" of the routing and holdings tests (integer ms)."""

S = 1_000
M = 60_000
H = 3_600_000
D = 24 * H
NOW = 1_795_910_400_000  # 2026-11-29T00:00:00Z
MIGRATION = 1_790_812_800_000  # 2026-10-01T00:00:00Z
