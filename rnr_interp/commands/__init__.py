"""The `rnr` commands: the only layer that parses options, prints and exits.

Every command has the same skeleton (`common.execute`): load its inputs, run the
analysis (a plain typed function of an analysis module), turn a known error into one
line on stderr and exit 2, print the result. `cli.py` registers them.

- `common`: shared options, `fail`, `load_inputs`, `execute`;
- `audit`: model-info, audit, pass-at-k, route;
- `localise`: failures, repair, steer, units (and their figure files);
- `compare`, `sweep`, `report`: one command each.
"""
