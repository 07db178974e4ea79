"""`kvstore bench trace FILE`: replay a Mooncake-format request trace (FAST'25,
`FAST25-release/traces/*.jsonl`) against a store and put its prefix-cache hit rate beside an exact
LRU and the infinite-cache bound at the same capacity (docs/traces.md).

    flags.py    the command's flags (argparse only: the CLI builds its parser cheaply)
    format.py   a trace's requests: reader, validator (TraceFormatError names the line), writer
    synth.py    small synthetic traces in the same format, for tests
    sim.py      the simulated caches: the infinite bound and an exact LRU, behind one protocol
    policies.py candidate eviction policies as simulated caches; arcsim.py the store's own ARC
    belady.py   Belady's offline policy: the reference the candidates are held to
    study.py    the policy study: every candidate at a sweep of capacities (docs/traces.md)
    storecost.py a trace through an in-process MetaStore: its hit rate and CPU per put, per policy
    sizing.py   KV bytes per token (model config or flag), the scale, the block and store sizes
    pacing.py   replay at the trace's timestamps (--speed)
    replay.py   the replay driver: one lookup, load and store per request against a TraceTarget
    results.py  what one capacity point measured, as frozen values
    report.py   the table and the text plots; png.py the PNG (matplotlib, when installed)
    command.py  the command: a fresh store per capacity point, the simulations, the report

This package's __init__ imports nothing: kvstore.bench reads flags.py when the CLI builds its parser.
"""
