"""The benchmarks: each measures and writes a JSON of figures (benchmarks/results/); none asserts anything.

Run each as a module from the repository root, `python -m benchmarks.bus --help`: the repository's packages
(engine, bridge, gates, and tests' support modules such as tests/bridge/bus_support.py) then import without
any `sys.path` edit. The environment block every result carries, and the writing of the JSON, are
benchmarks/harness.py's.
"""
