"""A fleet of hosts on one machine (network namespaces on a bridge, links shaped with tc tbf,
partitions by policy routing), shared by tests/fleet and the fleet benchmarks. Imports nothing
from kvstore: see netns.py and docs/fleet.md."""
