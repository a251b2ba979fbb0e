"""``python -m nvrx.launcher``: the same as the ``ft_launcher`` command."""

import sys

from nvrx.launcher.cli import main

sys.exit(main())
