"""`python -m trainwright` runs the command line."""

from trainwright.app.cli import main

raise SystemExit(main())
