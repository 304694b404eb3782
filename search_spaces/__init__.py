"""Search spaces as data: the YAML files beside this module (package data, nothing else).

The parser and validator live in the engine: ``nas.space.load_space("hybrid_small")`` or
``nas.space.load_space("my_space.yaml")``; ``nas spaces`` lists and prints them.
"""
