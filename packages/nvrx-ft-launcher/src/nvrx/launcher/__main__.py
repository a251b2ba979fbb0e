"""``python -m nvrx.launcher``: the same as the ``ft_launcher`` command."""

import sys

from nvrx.launcher.cli import main

__all__: list[str] = []

sys.exit(main())
