"""`python -m toposdns`."""

# Stop signals first: as PID 1 (a container without an init) an unhandled SIGTERM is lost.
from toposdns.lifecycle import exit_on_signals

exit_on_signals()

from toposdns.cli import main  # noqa: E402

raise SystemExit(main())
