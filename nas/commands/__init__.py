"""The ``nas`` commands, one module each (as Optuna's CLI has a class per command): its flags
(``add_parser(sub)``) and what it does (``run(args)``). ``_common`` holds what they share (the
consoles, the usage error, the argument types), ``_front`` the study tables, ``_lines`` the
search's progress lines. Importing a command module stays light: torch and optuna load when a
command runs."""
