"""``python -m examples.engine``: the main job (see ``examples/engine/cli.py``)."""

from examples.engine.cli import main

raise SystemExit(main())
