"""`python -m toposdns`."""

from toposdns.cli import main

raise SystemExit(main())
