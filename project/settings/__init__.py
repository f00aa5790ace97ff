"""Settings, one module per integration, all read from the environment.

`local` (the default) works on a developer machine with no `.env`; `production` requires
its secrets and addresses; `test` is what pytest uses.
"""
