"""The file formats the launcher and the ranks share, in one place.

Each file comes from outside the process that reads it, so every field is checked, one
way for all of them (:mod:`.checks`):

- :mod:`.cycle_info`: the cycle-info file the launcher writes for the ranks
  (``NVRX_CURRENT_CYCLE_INFO``), and its JSON Schema ``cycle_info.schema.json``;
- :mod:`.straggler_scores`: the straggler report file rank 0 writes for the launcher
  (``NVRX_STRAGGLER_SCORES_FILE``), and its JSON Schema ``straggler_scores.schema.json``.

Their public names are ``nvrx.ft``'s (``read_cycle_info``, ``write_straggler_scores``,
...); nothing is imported here, so reading one format never loads the other.
"""
