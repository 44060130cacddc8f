"""The ``diffattn`` command, one module per command group: what each command parses, prints and exits with, over the
library functions that do the work (``diffattn.train``, ``diffattn.eval``, ``diffattn.studies`` and the others hold no
argument parsing). :mod:`.parser` builds the parser from the modules of :data:`.parser.COMMAND_MODULES`;
:func:`diffattn.cli.main` runs it.

- :mod:`.demo` (``demo``), :mod:`.study` (``study``), :mod:`.models` (``models``), :mod:`.external`
  (``openclip-train``, ``timm-train``), :mod:`.data` (``data``), :mod:`.train` (``train``), :mod:`.eval` (``eval``,
  ``compare``, ``object-attention``, ``lm-eval``), :mod:`.inspect` (``inspect``), :mod:`.summary`
  (``study-summary``); :mod:`.common`: the argument types more than one of them uses.
- :mod:`.prepare`: what installs things on the machine, the offline data sets through apt, npm and pip
  (``diffattn data prepare``). The library's data layer (:mod:`diffattn.data`) only reads what it puts in the data
  directory.

Importing this package imports nothing: each module imports what its commands run.
"""
