"""The fleet the planner tests plan over: ten GPU nodes known by Hostname and instance."""

HOSTS = [f"gpu-node-{i:04d}" for i in range(10)]
INSTANCES = [f"{h}:9100" for h in HOSTS]
VALUES = {"Hostname": HOSTS, "instance": INSTANCES}
T = 1_700_000_000_000
HOUR = 3_600_000
