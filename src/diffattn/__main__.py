"""``python -m diffattn …`` (and ``torchrun … -m diffattn train CONFIG``) runs the ``diffattn`` command."""

import sys

from .cli import main

sys.exit(main())
