"""The main job: a 2-rank Lightning training run under ft_launcher with injected faults.

Until the launcher and Lightning callbacks land this says so and exits cleanly.
"""

from __future__ import annotations


def main() -> int:
    print("The nvrx demo (a 2-rank Lightning job under ft_launcher) arrives with the launcher.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
